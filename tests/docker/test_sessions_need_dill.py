"""A sandbox image without dill cannot keep a session: `keep_session` and a follow-up that would
restore a stored session are refused as tool errors before any run starts, naming the cause and
the fix. The image is the sandbox image with dill removed (built here, removed after)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from rlm_mcp.server.app import build_server
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_sandbox import docker_image
from tests.fixtures_sessions import image_without_dill
from tests.fixtures_surface import call, call_error, make_settings

__all__ = ["docker_image", "image_without_dill"]

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

SCRIPT = Script(
    root=['```repl\nanswer["content"] = "plain"\nanswer["ready"] = True\n```'],
    root_by_query=[
        RootScript(
            match="KEEP-Q", replies=['```repl\nkept = 7\nanswer["content"] = "kept"\nanswer["ready"] = True\n```']
        )
    ],
)


async def test_an_image_without_dill_refuses_kept_sessions_before_the_run(
    tmp_path: Path, docker_image: str, image_without_dill: str
) -> None:
    with ScriptedLM(SCRIPT) as lm:
        # The image with dill keeps a session; the server stores it in the data dir as it stops.
        settings = make_settings(tmp_path, lm.base_url, pool_size=0, sandbox_image=docker_image)
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="alpha beta")
            kept = await call(client, "rlm_complete", query="KEEP-Q", context_id=ctx["context_id"], keep_session=True)
            assert kept["status"] == "completed" and kept["answer"] == "kept"
            session_id = kept["session_id"]

        assert settings.sandbox.instance_id is not None
        hollow = settings.model_copy(
            update={"instance_id": settings.sandbox.instance_id + "b", "sandbox_image": image_without_dill}
        )
        async with Client(build_server(hollow)) as client:
            ctx = await call(client, "rlm_load_context", text="alpha beta")
            error = await call_error(
                client, "rlm_complete", query="KEEP-Q", context_id=ctx["context_id"], keep_session=True
            )
            assert f"{image_without_dill} has no" in error and "dill" in error
            assert "rlm-mcp image build" in error and "--offline" in error
            # The stored session's follow-up would restore its snapshot here: refused the same way.
            error = await call_error(client, "rlm_complete", query="AGAIN-Q", session_id=session_id)
            assert f"{image_without_dill} has no" in error and "rlm-mcp image build" in error
            # No session was opened and the stored one ran nothing more.
            listed = (await call(client, "rlm_list_sessions"))["sessions"]
            assert [(s["session_id"], s["runs"]) for s in listed] == [(session_id, [kept["run_id"]])]
            # Without a session the same image runs as before.
            plain = await call(client, "rlm_complete", query="PLAIN-Q", context_id=ctx["context_id"])
            assert plain["status"] == "completed" and plain["answer"] == "plain"
