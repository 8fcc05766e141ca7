"""A context that one of the owner's idle kept sessions holds is refused for deletion naming that
session and how to close it, not as "in use by a running run" with rlm_cancel (issue 41, low);
once the session is closed the context can be deleted. Real sandbox, embedded mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.assembly import build_service
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_engine import submit
from tests.fixtures_sandbox import docker_image
from tests.fixtures_sessions import dill_image
from tests.fixtures_surface import make_settings

__all__ = ["dill_image", "docker_image"]

pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.usefixtures("dill_image")]

SCRIPT = Script(root_by_query=[RootScript(match="KEEP-Q", replies=[submit('"kept"')])])


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


async def test_a_context_held_by_an_idle_session_is_refused_naming_the_session(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        async with build_service(make_settings(tmp_path, lm.base_url, pool_size=0)) as service:
            local = Caller(service, LOCAL_OWNER)
            ctx = await local.load_context(text="alpha")
            _, sid = await local.complete_in_session(
                "KEEP-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
            with pytest.raises(Exception) as refused:
                await local.delete_context(ctx.context_id)
            text = str(refused.value)
            assert f"held by your kept session {sid}" in text and "rlm_close_session" in text, text
            assert "running run" not in text and "rlm_cancel" not in text
            await local.close_session(sid)
            assert await local.delete_context(ctx.context_id) is True
