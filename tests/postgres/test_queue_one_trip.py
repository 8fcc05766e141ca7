"""The queue's transactions sent in fewer round trips (`store.pg.one_trip`): the enqueue (BEGIN,
its lock, the insert, COMMIT together) and the claim (its claim with the COMMIT). What they must
still do: commit before they return, and, when a statement fails, roll back everything and let
go of the lock, so the next start or claim goes on."""

from __future__ import annotations

from pathlib import Path

import anyio
import psycopg
import pytest

from tests.fixtures_queue_team import summary
from tests.postgres.test_queue_rules_pg import pg_team

pytestmark = pytest.mark.anyio


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
