"""The run queue's rules (tests/fixtures_queue_rules.py) over PostgreSQL (`store.pg.queue`):
the same bodies the fast tier runs over the in-memory queue (tests/unit/test_queue_rules.py).
A silent worker and an aged queue are set in the tables; time passes as time does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.runs import PgRunStore
from tests.fixtures_queue_rules import RULE_IDS, RULES
from tests.fixtures_queue_team import OpenTeam, Team, summary

pytestmark = pytest.mark.anyio


def pg_team(tmp_path: Path, url: str) -> OpenTeam:
    @asynccontextmanager
    async def open_team(**overrides: Any) -> AsyncIterator[Team]:
        settings = Settings(database_url=url, data_dir=tmp_path / "data", **({"worker_lease_s": 5.0} | overrides))
        async with make_stores(settings) as stores:
            db = stores.lifecycle
            assert isinstance(db, Database)
            async with db.connection() as conn:  # each rule starts from an empty queue
                await conn.execute("DELETE FROM rlm_runs")
                await conn.execute("DELETE FROM rlm_workers")

            async def silence(worker: int) -> None:
                async with db.connection() as conn:
                    await conn.execute(
                        "UPDATE rlm_workers SET heartbeat_at = now() - interval '1 hour' WHERE worker_id = %s",
                        (worker,),
                    )

            async def set_lm_called(run_id: str, value: bool) -> None:
                async with db.connection() as conn:
                    await conn.execute("UPDATE rlm_runs SET lm_called = %s WHERE run_id = %s", (value, run_id))

            async def age_queued(seconds: float) -> None:
                async with db.connection() as conn:
                    await conn.execute(
                        "UPDATE rlm_runs SET queued_at = queued_at - make_interval(secs => %s) WHERE state = 'queued'",
                        (seconds,),
                    )

            async def event_attempts(run_id: str) -> list[int]:
                async with db.connection() as conn:
                    cur = await conn.execute("SELECT attempt FROM rlm_run_events WHERE run_id = %s", (run_id,))
                    return [r["attempt"] for r in await cur.fetchall()]

            queue = PgRunQueue(queue_rules(settings.queue), db)
            logs = PgRunStore(db)
            yield Team(queue, logs, settings, silence, set_lm_called, age_queued, event_attempts, anyio.sleep, stores)

    return open_team


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
async def test_queue_rule(rule: Callable[[OpenTeam], Awaitable[None]], tmp_path: Path, pg_url: str) -> None:
    await rule(pg_team(tmp_path, pg_url))


async def test_a_worker_only_process_builds_no_front_and_a_front_does(tmp_path: Path, pg_url: str) -> None:
    """The assembly hands the queue down per role: a worker executes runs here (its backend is
    the local `RunManager` of the runs it claims) and follows none; a front follows them."""
    from rlm_mcp import assembly
    from rlm_mcp.service.queue.front import QueueFront
    from rlm_mcp.service.runs import RunManager
    from rlm_mcp.testing.settings import make_settings

    for role, backend in (("worker", RunManager), ("front", QueueFront)):
        (tmp_path / role).mkdir()
        settings = make_settings(tmp_path / role, database_url=pg_url, role=role)
        async with assembly.build_service(settings, mode="http") as service:
            assert type(service.runs) is backend


# The enqueue in one statement (the schema's `rlm_enqueue`: its lock, the count and the insert) and
# the claim in one round trip (`store.pg.one_trip`: its BEGIN, lock, claim and COMMIT) still commit
# before they return, and a statement that fails rolls everything back and lets go of the lock.
async def test_an_enqueue_and_a_claim_are_committed_when_they_return(tmp_path: Path, pg_url: str) -> None:
    async with pg_team(tmp_path, pg_url)() as team, await psycopg.AsyncConnection.connect(pg_url) as other:
        await team.queue.enqueue(summary("run_onetrip0000000001"), 1)
        cur = await other.execute("SELECT state FROM rlm_runs WHERE run_id = 'run_onetrip0000000001'")
        assert await cur.fetchone() == ("queued",)  # another session sees it: committed
        worker = await team.queue.register_worker("owner-onetrip", 4)
        row = await team.queue.claim(worker, 4, 4)
        assert row is not None and row.run_id == "run_onetrip0000000001" and row.attempt == 1
        cur = await other.execute("SELECT state, attempt FROM rlm_runs WHERE run_id = 'run_onetrip0000000001'")
        assert await cur.fetchone() == ("running", 1)


async def test_a_failed_enqueue_writes_nothing_and_lets_the_next_start_go_on(tmp_path: Path, pg_url: str) -> None:
    async with pg_team(tmp_path, pg_url)() as team:
        await team.queue.enqueue(summary("run_onetrip0000000002"), 1)
        with pytest.raises(psycopg.errors.UniqueViolation):  # the same run id again: the insert fails
            await team.queue.enqueue(summary("run_onetrip0000000002", query="again"), 1)
        # Its lock was let go and its connection is usable: the next start is queued at once.
        with anyio.fail_after(30):
            await team.queue.enqueue(summary("run_onetrip0000000003"), 1)
        assert await team.queue.queued_counts("local") == (2, 2)
        row = await team.queue.read("run_onetrip0000000002")
        assert row is not None and row.summary.request.query == "q"  # the first one, untouched
