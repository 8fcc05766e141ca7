"""Team mode: a kept session's snapshot that does not end gives the worker's slot back at its
deadline (issue 41, finding 2). The session's own cell makes every snapshot piece slow (a minute
in all); the snapshot stops at RLM_MCP_CELL_TIMEOUT_S + RLM_MCP_SESSION_SNAPSHOT_WAIT_S, the
worker drops that sandbox, and another owner's run, queued for the only slot, is claimed instead
of ending "No worker took the run". One process (front and worker), real Docker and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from rlm_mcp.assembly import build_service
from rlm_mcp.owners import Owner
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_engine import cell, submit
from tests.fixtures_sessions import SLOW_PIECES
from tests.fixtures_surface import make_settings

pytestmark = pytest.mark.anyio

SCRIPT = Script(
    root=[submit('"plain"')],
    root_by_query=[RootScript(match="SLOW-Q", replies=[cell(SLOW_PIECES), submit('"slow"')])],
)


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


def _snapshot_state(db: str, session_id: str) -> tuple[object, object, object]:
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute(
            "SELECT state, worker_id, snapshot_error FROM rlm_sessions WHERE session_id = %s", (session_id,)
        ).fetchone()
    assert found is not None
    return found[0], found[1], found[2]


async def test_a_snapshot_past_its_deadline_gives_the_workers_slot_back(tmp_path: Path, pg_migrated_url: str) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            pool_size=0,
            max_sandboxes=1,
            database_url=pg_migrated_url,
            cell_timeout_s=5,
            cell_output_bytes=8192,
            session_snapshot_wait_s=5,  # deadline 10 s; the snapshot would take a minute
            run_queue_timeout_s=40,
        )
        async with build_service(settings) as service:
            alice, bob = Caller(service, Owner("alice")), Caller(service, Owner("bob"))
            ctx = await alice.load_context(text="alpha")
            slow, sid = await alice.complete_in_session(
                "SLOW-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert slow.answer == "slow" and sid is not None
            await alice.close_session(sid)  # closed while its snapshot is under way on the worker
            theirs = await bob.load_context(text="beta")
            plain = await bob.complete("OTHER-Q", theirs.context_id, RunOverrides(), _quiet)
            assert plain.status == "completed" and plain.answer == "plain", plain
            state, holder, _ = _snapshot_state(pg_migrated_url, sid)
            assert (state, holder) == ("closed", None)
