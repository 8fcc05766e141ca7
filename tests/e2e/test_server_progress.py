"""Progress through the SDK's in-process client: context loads and runs report progress that only
grows, no event is lost while a report is being sent, and a quiet run gets heartbeats (a real
Docker sandbox and the scripted LM on loopback)."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.server.app import build_server
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_store import LoopbackServer
from tests.fixtures_surface import ANSWER_NOW, call, make_settings

pytestmark = pytest.mark.anyio


async def test_slow_context_loads_send_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http_server: LoopbackServer
) -> None:
    import threading

    import rlm_mcp.server.tool_calls as tool_calls

    # The server answers only once the client has seen a progress line: the load is slow for as
    # long as it takes, and the test cannot pass without a heartbeat.
    release = threading.Event()
    http_server.route("/slow.txt", b"worth the wait", Content_Type="text/plain", hold=release)
    url = http_server.url("/slow.txt")
    monkeypatch.setattr(tool_calls, "HEARTBEAT_S", 0.2)
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")
        release.set()

    async with Client(build_server(make_settings(tmp_path, "http://127.0.0.1:9/v1"))) as client:
        result = await client.call_tool("rlm_load_context", {"url": url}, progress_callback=on_progress)
        assert result.structured_content["bytes"] == len(b"worth the wait")
    assert release.is_set()
    assert any(m.startswith(f"loading {url}") for m in messages), messages


async def test_complete_progress_values_strictly_increase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MCP: "The progress value MUST increase with each notification". The start line, the
    # queued/turn events and the heartbeats must not repeat a value (they used to repeat the
    # turn number: 0.0 for "started" and again for turn 0, then turn k at every heartbeat).
    import rlm_mcp.service.active_run as active_run_module
    import rlm_mcp.service.caller as caller_module

    original = active_run_module.wait_with_heartbeat

    async def fast_heartbeat(run: Any, report: Any, *, heartbeat_s: float = 5.0) -> Any:
        return await original(run, report, heartbeat_s=0.1)

    monkeypatch.setattr(caller_module, "wait_with_heartbeat", fast_heartbeat)
    slow = '```repl\nimport time\ntime.sleep(0.6)\nprint("step")\n```'
    values: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        values.append(progress)

    with ScriptedLM(Script(root=[slow, slow, ANSWER_NOW])) as lm:
        async with Client(build_server(make_settings(tmp_path, lm.base_url))) as client:
            ctx = await call(client, "rlm_load_context", text="c")
            result = await client.call_tool(
                "rlm_complete", {"query": "q", "context_id": ctx["context_id"]}, progress_callback=on_progress
            )
            assert not result.is_error, result.content
            assert result.structured_content["status"] == "completed"
    assert len(values) >= 5, values
    assert all(b > a for a, b in itertools.pairwise(values)), values


async def test_an_event_during_a_progress_report_is_not_lost() -> None:
    # A turn that starts while the previous progress line is being sent must still be
    # reported at once, not at the next heartbeat.
    from rlm_mcp.engine import RunLimits, RunProgress
    from rlm_mcp.ports.runs import RunRequest
    from rlm_mcp.service.active_run import ActiveRun, wait_with_heartbeat

    limits = RunLimits(max_iterations=3, max_depth=1, timeout_s=60, token_budget=None, max_errors=5)
    run = ActiveRun(
        "r",
        RunRequest(query="q", context_ids=["c"], limits=limits, owner=LOCAL_OWNER),
        RunProgress(run_id="r", max_iterations=3),
    )
    seen: list[tuple[str | None, float]] = []
    start = anyio.current_time()

    async def report(event: str | None) -> None:
        seen.append((event, anyio.current_time() - start))
        if len(seen) == 1:
            run.notify("turn_start")  # happens while this report is in flight
        else:
            run.result = object()  # type: ignore[assignment]
            run.done.set()
            run.notify("run_end")

    # No heartbeat within the test: a notification lost while a report is in flight would leave
    # the wait hanging, and fail_after turns that into a failure.
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(wait_with_heartbeat, run, report, heartbeat_s=3600))
            await wait_until(lambda: run._changed.statistics().tasks_waiting, what="the waiter parking")
            run.notify("turn_start")
    assert [e for e, _ in seen] == ["turn_start", "turn_start"], seen


async def test_a_quiet_run_gets_heartbeats_and_the_events_after_them() -> None:
    # Nothing happens for a heartbeat's time: a line without an event, again and again; an
    # event after them is reported once, and the run's end ends the wait without a line.
    from rlm_mcp.engine import RunLimits, RunProgress
    from rlm_mcp.ports.runs import RunRequest
    from rlm_mcp.service.active_run import ActiveRun, wait_with_heartbeat

    limits = RunLimits(max_iterations=3, max_depth=1, timeout_s=60, token_budget=None, max_errors=5)
    run = ActiveRun(
        "r",
        RunRequest(query="q", context_ids=["c"], limits=limits, owner=LOCAL_OWNER),
        RunProgress(run_id="r", max_iterations=3),
    )
    seen: list[str | None] = []

    async def report(event: str | None) -> None:
        seen.append(event)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(wait_with_heartbeat, run, report, heartbeat_s=0.05))
            await wait_until(lambda: len(seen) >= 2, what="two heartbeats")
            run.notify("turn_start")
            await wait_until(lambda: "turn_start" in seen, what="the turn reported")
            await wait_until(lambda: seen[-1] is None, what="a heartbeat after the turn")
            run.result = object()  # type: ignore[assignment]
            run.done.set()
            run.notify("run_end")
    assert seen[:2] == [None, None], seen
    assert [e for e in seen if e is not None] == ["turn_start"], seen
