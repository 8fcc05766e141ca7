"""Team mode: a worker whose image cannot restore a kept session (no dill) claims none of its
runs (issue 41, finding 6). A session kept by a worker with dill, its snapshot stored, is followed
up while only a worker without dill is running: that worker leaves the run queued (it used to
claim it and restore into an empty REPL) and still runs everything else. Real Docker and
PostgreSQL, one process per phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.assembly import build_service
from rlm_mcp.owners import Owner
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import cell, submit
from tests.fixtures_sandbox import docker_image
from tests.fixtures_sessions import image_without_dill, session_row
from tests.fixtures_surface import make_settings

__all__ = ["docker_image", "image_without_dill"]

pytestmark = pytest.mark.anyio

SCRIPT = Script(
    root=[submit('"plain"')],
    root_by_query=[
        RootScript(match="KEEP-Q", replies=[cell("kept = 41"), submit('"kept"')]),
        RootScript(match="AGAIN-Q", replies=[submit("str(kept + 1)")]),
    ],
)


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


async def test_a_worker_without_dill_leaves_a_sessions_run_to_others(
    tmp_path: Path, pg_migrated_url: str, docker_image: str, image_without_dill: str
) -> None:
    owner = Owner("local")
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(
            tmp_path, lm.base_url, pool_size=0, database_url=pg_migrated_url, sandbox_image=docker_image
        )
        async with build_service(settings) as service:
            caller = Caller(service, owner)
            ctx = await caller.load_context(text="alpha")
            kept, sid = await caller.complete_in_session(
                "KEEP-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert kept.answer == "kept" and sid is not None
            await wait_until(lambda: session_row(pg_migrated_url, sid)["snapshot_gen"] == 1, what="the snapshot")

        assert settings.sandbox.instance_id is not None
        hollow = settings.model_copy(
            update={
                "instance_id": settings.sandbox.instance_id + "b",
                "sandbox_image": image_without_dill,
                "run_queue_timeout_s": 8,
            }
        )
        async with build_service(hollow) as service:
            caller = Caller(service, owner)
            plain = await caller.complete("PLAIN-Q", ctx.context_id, RunOverrides(), _quiet)
            assert plain.status == "completed" and plain.answer == "plain"
            left, _ = await caller.complete_in_session("AGAIN-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert left.status == "error" and "No worker took the run" in (left.reason or ""), left
            assert session_row(pg_migrated_url, sid)["generation"] == 1  # nothing ran in the session
