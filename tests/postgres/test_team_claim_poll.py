"""A worker's timed look (no wake-up came within its interval) first asks whether any run is
queued (`any_queued`), and takes the claim's lock and transaction only then (issue 39 item 6: an
idle worker polled with four round trips and the team-wide claim lock every poll interval). Real
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


async def test_the_timed_look_takes_no_claim_lock(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        await queue.register_worker("owner-poll", 4)
        # Another claim holds the team-wide claim lock: a claim that took it would wait here.
        async with await psycopg.AsyncConnection.connect(pg_url) as holder:
            await holder.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK_KEY,))
            with anyio.fail_after(30):  # a bound, not a timing: a look that took the claim's lock would never return
                assert not await queue.any_queued()
            await holder.rollback()


async def test_the_timed_look_finds_a_queued_run_and_the_claim_takes_it(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        worker = await queue.register_worker("owner-poll", 4)
        # Queued with its wake-up unheard (nobody listens here): the timed claim is what finds it.
        await queue.enqueue(summary("run_polled0000000001"), 1)
        assert await queue.any_queued()
        row = await queue.claim(worker, 8, 8)
        assert row is not None and row.run_id == "run_polled0000000001" and row.attempt == 1
        assert not await queue.any_queued()
