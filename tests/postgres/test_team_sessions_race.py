"""Team mode's side of issue 41, finding 4: a follow-up racing the end of its session (closed, or
expired by a worker's sweep) after the front found it free. The team session backend claims the
session in the database when it starts the run, under the same conditions close and the expiry
require, so the follow-up is refused saying why, and nothing is queued for the ended session."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.errors import NotFoundError
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunLimits, RunRequest
from rlm_mcp.ports.session_store import AfterRun
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.team_sessions import TeamSessions
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.sessions import PgSessionStore
from rlm_mcp.testing.settings import make_settings

pytestmark = pytest.mark.anyio

DAY = 86400.0
ALICE = Owner("alice")


@pytest.mark.parametrize("how", ["closed", "expired"])
async def test_a_follow_up_racing_the_end_of_its_team_session_queues_nothing(
    tmp_path: Path, pg_url: str, how: str
) -> None:
    settings = make_settings(tmp_path, database_url=pg_url, session_max_age_s=DAY)
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        store = PgSessionStore(db)
        sessions = TeamSessions(settings.sessions, store)
        queue = PgRunQueue(queue_rules(settings.queue), db)
        async with QueueFront(settings.queue, queue, Wakeups(queue)) as front:
            sessions.queue_through(front)
            await store.open("ses_1", "alice", "run_first", cap=4, max_age_s=DAY)
            # Its first run ended on a worker: the session is free for a follow-up.
            await store.finish_run("ses_1", "run_first", AfterRun(worker_id=None, began=True))
            assert (await sessions.find("ses_1", owner=ALICE)).session_id == "ses_1"
            if how == "closed":
                await sessions.close("ses_1", owner=ALICE)
            else:
                assert await store.expire(max_age_s=0.0) == 1

            request = RunRequest(
                query="again",
                context_ids=[],
                owner=ALICE,
                limits=RunLimits(max_iterations=3, max_depth=1, timeout_s=60.0, token_budget=None, max_errors=3),
                session_id="ses_1",
            )
            why = "was closed" if how == "closed" else "reached its maximum age"
            with pytest.raises(NotFoundError, match=f"Session ses_1 {why}"):
                await sessions.start(request, None)
            row = await store.read("ses_1")
            assert row is not None and row.state == how and row.run_ids == ["run_first"]
            async with db.connection() as conn:
                cur = await conn.execute("SELECT count(*) AS n FROM rlm_runs")
                counted = await cur.fetchone()
            assert counted is not None and counted["n"] == 0  # nothing was queued for it
