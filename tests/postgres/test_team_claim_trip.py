"""A claim is one round trip: its BEGIN, the team-wide lock, the claim and the COMMIT go out
together (`one_trip.locked_in_one_trip`), so the lock is never held while a worker's event loop
gets round to its next statement. The share it applies is of the live slots the previous claim
found, checked under the lock: when a worker came or went since, that claim takes nothing and the
next applies the share to the new count. Real PostgreSQL, in process."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import psycopg
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.ports.queue import RunState
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.locks import CLAIM_LOCK_KEY
from rlm_mcp.store.pg.one_trip import locked_in_one_trip
from rlm_mcp.store.pg.queue import PgRunQueue
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

LIMITS = {"max_iterations": 5, "max_depth": 1, "timeout_s": 60.0, "token_budget": None, "max_errors": 3}


# Every run is alice's: the share decides how many of them one worker may hold.
QUEUED = {"query": "q", "context_ids": [], "owner": "alice", "limits": LIMITS, "status": "queued"}


async def test_a_claim_applies_the_share_to_the_live_slots_after_a_worker_joins(tmp_path: Path, pg_url: str) -> None:
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "data")
    asked: list[int] = []

    def share(slots: int) -> int:  # one run per owner on two slots, three from four slots on
        asked.append(slots)
        return 1 if slots <= 2 else 3

    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        queue = PgRunQueue(dataclasses.replace(queue_rules(settings.queue), share=share), db)
        first = await queue.register_worker("owner-a", 2)
        for n in range(3):
            await queue.enqueue(run_record(f"run-{n}", QUEUED), 1)

        claimed = await queue.claim_many(first, 8, 8, limit=3)
        # The first claim knew no count: it learnt two slots, then claimed with their share (one).
        assert [row.run_id for row in claimed] == ["run-0"]
        assert asked[-1] == 2

        await queue.register_worker("owner-b", 2)  # four live slots now: a share of three
        again = await queue.claim_many(first, 8, 8, limit=3)
        # With the share of two slots alice (one running) would get nothing; with that of four she
        # gets another (at most half the two eligible runs: two live workers).
        assert [row.run_id for row in again] == ["run-1"]
        assert asked[-1] == 4


async def test_a_claim_never_applies_the_share_of_a_worker_that_left(tmp_path: Path, pg_url: str) -> None:
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "data")
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        queue = PgRunQueue(
            dataclasses.replace(queue_rules(settings.queue), share=lambda slots: 1 if slots <= 2 else 3), db
        )
        first = await queue.register_worker("owner-a", 2)
        second = await queue.register_worker("owner-b", 2)
        for n in range(3):
            await queue.enqueue(run_record(f"run-{n}", QUEUED), 1)
        # Four live slots: a share of three, at most half the three eligible runs (rounded up).
        assert [row.run_id for row in await queue.claim_many(first, 8, 8, limit=3)] == ["run-0", "run-1"]

        await queue.unregister_worker(second)  # two live slots now: a share of one, held already
        assert await queue.claim_many(first, 8, 8, limit=3) == []
        still = await queue.read("run-2")
        assert still is not None and still.state == RunState.QUEUED


async def test_a_failed_statement_rolls_the_locked_transaction_back(tmp_path: Path, pg_url: str) -> None:
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "data")
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        async with db.connection() as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await locked_in_one_trip(
                    conn, "SELECT pg_advisory_xact_lock(%(key)s)", {"key": CLAIM_LOCK_KEY}, "SELECT 1 / 0", {}
                )
            # Rolled back: the connection is idle again, the lock released, and the next works.
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            cur = await conn.execute("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'")
            assert (await cur.fetchone()) == {"n": 0}
            rows = await locked_in_one_trip(
                conn, "SELECT pg_advisory_xact_lock(%(key)s)", {"key": CLAIM_LOCK_KEY}, "SELECT 2 AS two", {}
            )
            assert rows == [{"two": 2}]
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
