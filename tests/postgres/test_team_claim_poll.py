"""A worker's timed claim (`polled`: no wake-up came within the poll interval) first asks whether
any run is queued, and takes the claim's lock and transaction only then (issue 39 item 6: an idle
worker polled with four round trips and the team-wide claim lock every poll interval). Real
PostgreSQL, in process."""

from __future__ import annotations

from pathlib import Path

import anyio
import psycopg
import pytest

from rlm_mcp.store.pg.locks import CLAIM_LOCK_KEY
from tests.fixtures_sessions import team
from tests.fixtures_store import summary

pytestmark = pytest.mark.anyio


async def test_a_timed_claim_with_nothing_queued_takes_no_claim_lock(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        worker = await queue.register_worker("owner-poll", 4)
        # Another claim holds the team-wide claim lock: a claim that took it would wait here.
        async with await psycopg.AsyncConnection.connect(pg_url) as holder:
            await holder.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK_KEY,))
            with anyio.fail_after(30):  # a bound, not a timing: without the look first it never returns
                assert await queue.claim(worker, 8, 8, polled=True) is None
            await holder.rollback()


async def test_a_timed_claim_takes_a_queued_run(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        worker = await queue.register_worker("owner-poll", 4)
        # Queued with its wake-up unheard (nobody listens here): the timed claim is what finds it.
        await queue.enqueue(summary("run_polled0000000001"), 1)
        row = await queue.claim(worker, 8, 8, polled=True)
        assert row is not None and row.run_id == "run_polled0000000001" and row.attempt == 1
        assert await queue.claim(worker, 8, 8, polled=True) is None
