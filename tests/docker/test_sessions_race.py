"""A follow-up racing the end of its session (issue 41, finding 4): the session is closed, or
reaches its maximum age, after the follow-up was checked and before its run starts. The follow-up
is refused saying why, and no sandbox is opened for the ended session (one that nobody would
release: with one slot, every later run would wait for it in vain)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from rlm_mcp.assembly import build_service
from rlm_mcp.errors import NotFoundError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.service.service import RlmService
from rlm_mcp.service.sessions import SessionManager
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_engine import submit

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


def _end_during_checks(service: RlmService, end: object) -> None:
    """Run `end` (the session's end) inside the follow-up's last check before its run starts:
    after the session was found free, before it is claimed."""
    check_lm = service.check_lm

    async def ending_then_checking() -> None:
        await end()  # type: ignore[operator]
        await check_lm()

    service.check_lm = ending_then_checking  # type: ignore[method-assign]


@pytest.mark.parametrize("how", ["closed", "expired"])
async def test_a_follow_up_racing_the_end_of_its_session_opens_no_sandbox(tmp_path: Path, how: str) -> None:
    with ScriptedLM(Script(root=[submit('"done"')])) as lm:
        settings = make_settings(
            tmp_path, base_url=lm.base_url, pool_size=0, max_sandboxes=1, sandbox_memory="512m", cell_timeout_s=30
        )
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            info = await local.load_context(text="alpha beta")
            result, sid = await local.complete_in_session(
                "FIRST-Q", info.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert result.status == "completed" and sid is not None
            assert service.sandboxes.free_slots == 0  # the session's REPL holds the one slot

            async def end() -> None:
                if how == "closed":
                    await local.close_session(sid)
                else:  # the sweep finds it past RLM_MCP_SESSION_MAX_AGE_S
                    embedded = cast(SessionManager, service.sessions)
                    embedded._settings = settings.model_copy(update={"session_max_age_s": 0.0}).kept_sessions
                    await embedded.sweep()

            _end_during_checks(service, end)
            why = "was closed" if how == "closed" else "reached its maximum age"
            with pytest.raises(NotFoundError, match=f"Session {sid} {why}"):
                await local.start_run("AGAIN-Q", None, RunOverrides(), session_id=sid)
            # Nothing was opened for the ended session: its slot is free for the next run.
            assert service.sandboxes.free_slots == 1
            service.check_lm = type(service).check_lm.__get__(service)  # type: ignore[method-assign]
            plain = await local.complete("PLAIN-Q", info.context_id, RunOverrides(), _quiet)
            assert plain.status == "completed" and plain.answer == "done"
