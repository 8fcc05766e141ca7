"""A sweep's reads in one round trip (`PgRunQueue.sweep_look`, service/queue/sweeper.py): the one
statement answers the plan, the lost runs and the workers, and a sweep with nothing to act on
takes one connection from the pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.service.queue.sweeper import Sweeper
from rlm_mcp.store.pg.db import Conn
from tests.fixtures_sessions import team
from tests.fixtures_store import summary
from tests.fixtures_sweepers import Clock, connected_sweepers, silence

pytestmark = pytest.mark.anyio


async def test_the_one_look_answers_the_plan_the_lost_runs_and_the_workers(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (db, queue, settings):
        gone = await queue.register_worker("owner-gone", 4)
        await queue.register_worker("owner-here", 4)
        await queue.enqueue(summary("run_look_lost00000001"), 1)
        assert await queue.claim(gone, 8, 8) is not None
        await silence(db, gone)
        look = await queue.sweep_look()
        assert look.lost_runs == ["run_look_lost00000001"]
        assert [(w.worker_id, w.owner_id) for w in look.lost_workers] == [(gone, "owner-gone")]
        assert look.live_owners == {"owner-here"}
        assert look.oldest_s is not None and -settings.team.worker_lease_s < look.oldest_s <= 0
        assert (await queue.sweep_look()).up_s >= look.up_s > 0  # the database's own uptime


async def test_a_sweep_with_nothing_to_do_takes_one_connection(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Housekeeping every 5 poll intervals (15 s): not due again in these rounds.
    async with team(tmp_path, pg_url, queue_poll_s=3.0) as (db, queue, settings):
        await queue.register_worker("owner-here", 4)
        [judging] = await connected_sweepers(settings, queue, 1)
        liveness = LeaseLiveness()
        clock = Clock()
        with_liveness = Sweeper(settings.queue, queue, liveness=liveness, clock=clock)
        await with_liveness.sweep_once()  # its first round does the housekeeping too
        lent = 0
        real = db.connection

        @asynccontextmanager
        async def counted() -> AsyncIterator[Conn]:
            nonlocal lent
            lent += 1
            async with real() as conn:
                yield conn

        monkeypatch.setattr(db, "connection", counted)
        await judging.sweep_once()  # judges leases: nobody lost
        await with_liveness.sweep_once()  # keeps the liveness current
        assert lent == 2
        assert liveness.live == {"owner-here"}
