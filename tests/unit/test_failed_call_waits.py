"""A call that fails for good still shows what it waited through: the run log's `llm_call`
event of a sub-call or root call that ran out of retries carries its retries and its sleeps
(before, a failed call's event had none, though the client had counted them), and the run's
view model sums them with the answered calls'."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from rlm_mcp.events import LLMCall, LoggedEvent
from rlm_mcp.testing.servers import free_port
from rlm_mcp.viewer.model import build_run
from tests.fixtures_engine import repl, run_at_endpoint
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

_CELL = repl('r = llm_query("part 1")\nanswer["content"] = r\nanswer["ready"] = True')


@asynccontextmanager
async def failing_endpoint(*, fail_root: bool) -> AsyncIterator[str]:
    """A loopback endpoint whose sub-calls (no system message) always get a 500; root calls get
    one cell making one sub-call, or a 500 too when `fail_root`."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        is_root = body["messages"][0].get("role") == "system"
        if fail_root or not is_root:
            return web.json_response({"error": {"message": "upstream fell over"}}, status=500)
        return web.json_response(
            {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": _CELL}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "rlm-v0.1", "max_model_len": 16384}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def run_against(tmp_path: Path, *, fail_root: bool) -> tuple[str, list[LoggedEvent]]:
    async with failing_endpoint(fail_root=fail_root) as url:
        result, events = await run_at_endpoint(
            tmp_path, url, run_id="run_f", max_iterations=2, lm_retries=2, backoff_base_s=0.01, timeout_s=60
        )
    return result.status, list(events)


async def test_a_sub_call_that_ran_out_of_retries_logs_them(tmp_path: Path) -> None:
    status, events = await run_against(tmp_path, fail_root=False)
    assert status == "completed"
    (failed,) = [e for e in events if isinstance(e, LLMCall) and e.role == "sub"]
    assert failed.status == "error" and "500" in (failed.error or "")
    # Two retries after the first attempt, each after a sleep.
    assert failed.retries == 2 and (failed.backoff_s or 0) > 0
    assert failed.throttled is None  # a 500 is a failure, not "less load, please"
    waits = build_run(run_record("run_f"), events)["lm_waits"]
    assert waits["retried"] == 1 and waits["retries"] == 2 and waits["backoff_s"] == failed.backoff_s


async def test_a_root_call_that_ran_out_of_retries_logs_them(tmp_path: Path) -> None:
    status, events = await run_against(tmp_path, fail_root=True)
    assert status == "error"
    (failed,) = [e for e in events if isinstance(e, LLMCall)]
    assert failed.role == "root" and failed.status == "error"
    assert failed.retries == 2 and (failed.backoff_s or 0) > 0
