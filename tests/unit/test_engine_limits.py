"""Limits and faults: iterations, timeout, token budget, errors, LM failures, cancellation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest

from rlm_mcp.engine import RLMEngine, RunNotStarted, RunProgress
from rlm_mcp.events import RunEvent, TurnStart
from rlm_mcp.ports.chat import LMConnectionError, LMModelNotFoundError, LMServerError
from rlm_mcp.ports.engine import ContextSpec, Sandbox
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import (
    Events,
    FakeChatModel,
    FakeSandboxFactory,
    make_context,
    make_limits,
    make_settings,
    repl,
    run_engine,
)

pytestmark = pytest.mark.anyio


async def test_max_iterations_with_submit_turn(tmp_path: Path) -> None:
    lm = FakeChatModel(
        root=[repl("print(1)"), repl("print(2)"), repl('answer["content"]="best guess"; answer["ready"]=True')]
    )
    result, events, _, progress = await run_engine(tmp_path, lm, max_iterations=2)
    assert result.status == "max_iterations"
    assert result.answer == "best guess"
    assert len(lm.root_calls) == 3
    last = lm.root_calls[2].messages[-1]
    assert (
        last["role"] == "user"
        and last["content"].startswith("Turn 3/2:")
        and "Submit your best answer now" in last["content"]
    )
    assert "submitted on the extra turn" in (result.reason or "")


async def test_max_iterations_without_submit_turn(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("print(1)"), repl("print(2)")])
    result, *_ = await run_engine(
        tmp_path, lm, settings=make_settings(submit_on_max_iterations=False), max_iterations=2
    )
    assert result.status == "max_iterations" and result.answer is None
    assert len(lm.root_calls) == 2
    assert result.reason == "max_iterations=2 reached"


async def test_timeout_interrupts_a_stuck_cell(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("block_forever()")])
    with anyio.fail_after(60):  # a cell the run's timeout did not interrupt would hang here
        result, events, factory, progress = await run_engine(tmp_path, lm, timeout_s=1.0)
    assert result.status == "timeout"
    assert "timeout_s=1" in (result.reason or "")
    assert factory.closed == 1 and progress.status == "timeout"
    assert events.of("run_end")[0]["status"] == "timeout"


async def test_timeout_interrupts_a_slow_lm_call(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("print(1)")], root_delay_s=30)
    result, *_ = await run_engine(tmp_path, lm, timeout_s=0.5)
    assert result.status == "timeout"


async def test_token_budget(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("x = llm_query('hi ' * 200)\nprint(x)")] * 10)
    result, events, _, progress = await run_engine(tmp_path, lm, token_budget=2500)
    assert result.status == "budget_exceeded"
    assert (
        result.usage.to_dict()["total"]["prompt_tokens"] + result.usage.to_dict()["total"]["completion_tokens"] > 2500
    )
    assert len(lm.root_calls) < 10


async def test_max_errors_counts_exceptions_only(tmp_path: Path) -> None:
    warn = repl("import sys\nsys.stderr.write('warning only')\nprint('ok')")
    boom = repl("raise ValueError('boom')")
    lm = FakeChatModel(root=[boom, boom, warn, boom, boom, boom, repl("print('unreached')")])
    result, events, *_ = await run_engine(tmp_path, lm, max_errors=3)
    assert result.status == "error"
    assert (result.reason or "").startswith("max_errors")
    assert len(lm.root_calls) == 6


async def test_first_call_connection_failure_is_raised(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[LMConnectionError("vLLM at http://x/v1 is unreachable", endpoint="http://x/v1")])
    with pytest.raises(RunNotStarted) as raised:
        await run_engine(tmp_path, lm)
    assert isinstance(raised.value.cause, LMConnectionError)


async def test_first_call_unknown_model_is_raised(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[LMModelNotFoundError("model rlm-v0.1 not served", endpoint="http://x/v1")])
    with pytest.raises(RunNotStarted) as raised:
        await run_engine(tmp_path, lm)
    assert isinstance(raised.value.cause, LMModelNotFoundError)


async def test_later_root_failure_is_an_error_result(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("print(1)"), LMConnectionError("connection refused", endpoint="http://x/v1")])
    result, events, factory, progress = await run_engine(tmp_path, lm)
    assert result.status == "error"
    assert "http://x/v1" in (result.reason or "")
    assert factory.closed == 1


async def test_first_call_server_error_is_a_result(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[LMServerError("HTTP 500", endpoint="http://x/v1")])
    result, *_ = await run_engine(tmp_path, lm)
    assert result.status == "error"


async def test_cancellation_propagates_after_cleanup(tmp_path: Path) -> None:
    settings = make_settings()
    lm = FakeChatModel(root=[repl("block_forever()")])
    factory = FakeSandboxFactory()
    events = Events()
    progress = RunProgress(run_id="r", max_iterations=5)
    engine = RLMEngine(settings.engine, lm, factory, system_prompt="S")
    cancelled = False
    async with anyio.create_task_group() as tg:

        async def go() -> None:
            nonlocal cancelled
            try:
                await engine.run(
                    run_id="r",
                    query="q",
                    contexts=[make_context(tmp_path)],
                    limits=make_limits(settings),
                    progress=progress,
                    emit=events,
                )
            except anyio.get_cancelled_exc_class():
                cancelled = True
                raise

        tg.start_soon(go)
        await wait_until(lambda: factory.opened and factory.opened[0].cells, what="the stuck cell starting")
        tg.cancel_scope.cancel()
    assert cancelled
    assert progress.status == "cancelled"
    assert factory.closed == 1
    assert events.of("run_end")[0]["status"] == "cancelled"


async def test_cut_off_reply_does_not_run_half_a_block(tmp_path: Path) -> None:
    cut = ("Plan.\n```repl\nx = 1\n```\nAnd more:\n```repl\nfor i in range(10):\n    print(i", "length")
    lm = FakeChatModel(
        root=[cut, ("```repl\nprint('half", "length"), repl('answer["content"]=x; answer["ready"]=True')]
    )
    result, events, factory, _ = await run_engine(tmp_path, lm)
    assert factory.opened[0].cells[0] == "x = 1"
    out1 = lm.root_calls[1].messages[4]
    assert out1["content"].startswith("REPL output:\n")
    assert "cut off" in out1["content"] and "shorter code" in out1["content"]
    notice = lm.root_calls[2].messages[7]
    assert notice["role"] == "user" and "cut off" in notice["content"]
    assert result.answer == "1"


async def test_restart_notice_reaches_the_model(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("v = 1\ncrash_kernel()"), repl('answer["content"]="r"; answer["ready"]=True')])
    result, events, *_ = await run_engine(tmp_path, lm)
    out = lm.root_calls[1].messages[4]["content"]
    # The sandbox's own notice (sandbox/session.py words it; the in-process fake words it alike).
    assert "SandboxRestarted" in out and "replaced by a fresh one: all variables were lost" in out
    assert events.of("cell")[0]["restarted"] is True


async def test_progress_is_live(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []
    progress_ref: dict[str, RunProgress] = {}

    lm = FakeChatModel(root=[repl("print(llm_query('a'))"), repl('answer["content"]="p"; answer["ready"]=True')])
    settings = make_settings()
    progress = RunProgress(run_id="r", max_iterations=20)
    progress_ref["p"] = progress

    async def sink(event: RunEvent) -> None:
        if isinstance(event, TurnStart):
            seen.append((progress.iterations, progress.status))

    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory(), system_prompt="S")
    result = await engine.run(
        run_id="r",
        query="q",
        contexts=[make_context(tmp_path)],
        limits=make_limits(settings),
        progress=progress,
        emit=sink,
    )
    assert seen == [(1, "running"), (2, "running")]
    assert progress.sub_calls == 1 == result.sub_calls
    assert progress.usage.total.calls == 3


async def test_a_failing_event_sink_does_not_end_the_run(tmp_path: Path) -> None:
    settings = make_settings()

    async def bad(event: RunEvent) -> None:
        raise RuntimeError("sink broke")

    lm = FakeChatModel(root=[repl('answer["content"]="s"; answer["ready"]=True')])
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory(), system_prompt="S")
    result = await engine.run(
        run_id="r",
        query="q",
        contexts=[make_context(tmp_path)],
        limits=make_limits(settings),
        progress=RunProgress(run_id="r", max_iterations=20),
        emit=bad,
    )
    assert result.status == "completed"


async def test_sandbox_failure_before_start_is_raised(tmp_path: Path) -> None:
    from contextlib import asynccontextmanager

    from rlm_mcp.errors import DockerUnavailableError

    @asynccontextmanager
    async def broken(
        contexts: Sequence[ContextSpec], *, levels_below: int = 0, kept: bool = False
    ) -> AsyncIterator[Sandbox]:
        raise DockerUnavailableError("Docker is not running.", "Start Docker.")
        yield

    settings = make_settings()
    engine = RLMEngine(settings.engine, FakeChatModel(), broken, system_prompt="S")
    with pytest.raises(RunNotStarted) as raised:
        await engine.run(
            run_id="r",
            query="q",
            contexts=[make_context(tmp_path)],
            limits=make_limits(settings),
            progress=RunProgress(run_id="r", max_iterations=20),
            emit=Events(),
        )
    assert isinstance(raised.value.cause, DockerUnavailableError)
