"""Kept sessions in the engine: the REPL outlives a run; contexts and histories as the reference's
persistent mode lays them out (context_i, history_i, the turn notes)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.engine import RLMEngine, RunProgress
from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.ports import ContextSpec
from tests.fixtures_engine import (
    Events,
    FakeChatModel,
    FakeSandboxFactory,
    make_context,
    make_limits,
    make_settings,
    repl,
)

pytestmark = pytest.mark.anyio


async def _run(engine: RLMEngine, session: SessionSandbox, run_id: str, query: str, contexts: list[ContextSpec]) -> Any:
    limits = make_limits(make_settings(), max_iterations=6)
    return await engine.run(
        run_id=run_id,
        query=query,
        contexts=contexts,
        limits=limits,
        progress=RunProgress(run_id=run_id, max_iterations=6),
        emit=Events(),
        session=session,
    )


def _listing(message: str) -> list[str]:
    return list(ast.literal_eval(message.split("REPL variables: ", 1)[1].strip()))


async def test_follow_ups_reuse_the_repl_with_contexts_and_histories(tmp_path: Path) -> None:
    first = make_context(tmp_path, "alpha " * 20, name="a")
    second = make_context(tmp_path, "beta " * 30, name="b")
    lm = FakeChatModel(
        root=[
            repl("index = {w: i for i, w in enumerate(context.split())}\nprint(len(index))"),
            repl('answer["content"] = "one"\nanswer["ready"] = True'),
            # run 2: reads run 1's variable, the new context and the first conversation
            repl("print(len(index), len(context_1), history[0]['role'], len(history_0))"),
            repl('answer["content"] = str(len(context_1))\nanswer["ready"] = True'),
            # run 3: no new context
            repl("print(sorted(k for k in globals() if k.startswith(('context', 'history'))))"),
            repl('answer["content"] = "three"\nanswer["ready"] = True'),
        ]
    )
    factory = FakeSandboxFactory()
    engine = RLMEngine(make_settings().engine, lm, factory, system_prompt="SYS")
    session = SessionSandbox("ses_test")
    try:
        one = await _run(engine, session, "run-1", "How many words?", [first])
        assert one.status == "completed" and one.answer == "one"
        assert session.live and factory.closed == 0  # the sandbox outlived the run
        two = await _run(engine, session, "run-2", "And the second?", [second])
        assert two.status == "completed" and two.answer == str(len("beta " * 30))
        three = await _run(engine, session, "run-3", "Which names?", [])
        assert three.answer == "three"
    finally:
        await session.release()
    assert len(factory.opened) == 1 and factory.closed == 1
    calls = lm.root_calls
    # Run 2's opening: its own metadata (the new context), the notes on contexts and history.
    run2 = calls[2].messages
    assert run2[0]["content"] == "SYS"
    assert "Your context is a str of 150 total characters." in run2[1]["content"]
    assert "This question adds 1 context: context_1 is a str of 150 characters." in run2[1]["content"]
    assert run2[2]["content"].endswith(
        "Turn 1/6:\n\nNote: You have 2 contexts available (context_0 through context_1)."
        "\n\nNote: Your earlier conversation in this session is in the REPL variable `history`."
    )
    output = calls[3].messages[4]["content"]
    # history_0: the messages run 1's last root call was sent (system .. `Turn 2/6:`), as the reference stores
    assert output.startswith("REPL output:\n\n1 150 system 6\n")
    names = _listing(output)
    assert names.index("index") < names.index("history_0") < names.index("history") < names.index("context_1")
    # Run 3 added no context: the metadata says so, the turn notes count two conversations.
    run3 = calls[4].messages
    assert (
        "No new context was added for this question: the REPL still holds context_0 through context_1"
        in (run3[1]["content"])
    )
    assert run3[2]["content"].endswith("in the REPL variables history_0 through history_1 (`history` is history_0).")
    printed = calls[5].messages[4]["content"]
    assert "['context', 'context_0', 'context_1', 'history', 'history_0', 'history_1']" in printed


async def test_a_run_without_a_session_still_closes_its_sandbox(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl('answer["content"] = "x"\nanswer["ready"] = True')])
    factory = FakeSandboxFactory()
    engine = RLMEngine(make_settings().engine, lm, factory, system_prompt="SYS")
    result = await engine.run(
        run_id="r",
        query="q",
        contexts=[make_context(tmp_path)],
        limits=make_limits(make_settings(), max_iterations=3),
        progress=RunProgress(run_id="r", max_iterations=3),
        emit=Events(),
    )
    assert result.status == "completed" and factory.closed == 1
