"""The answer protocol: dict at end of cell, update, rebinding, FINAL/FINAL_VAR, never-ready."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.engine.parsing import find_legacy_final, find_repl_blocks, has_unclosed_repl_block
from tests.fixtures_engine import FakeChatModel, make_settings, repl, run_engine

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ('answer["ready"] = True\nanswer["content"] = "late content"', "late content"),
        ('answer.update({"content": "via update", "ready": True})', "via update"),
        ('answer = {"content": "rebound", "ready": True}', "rebound"),
        ('answer["content"] = [1, 2]\nanswer["ready"] = True', "[1, 2]"),
        ('answer["content"] = 3.5\nanswer["ready"] = True', "3.5"),
        ('FINAL_VAR("x")', "value of x"),
    ],
)
async def test_answer_variants(tmp_path: Path, code: str, expected: str) -> None:
    lm = FakeChatModel(root=[repl("x = 'value of x'"), repl(code)])
    result, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed"
    assert result.answer == expected
    assert result.iterations == 2


async def test_stop_at_first_ready_block(tmp_path: Path) -> None:
    reply = repl('answer["content"]="first"; answer["ready"]=True') + "\n" + repl("print('never')")
    lm = FakeChatModel(root=[reply])
    result, events, factory, _ = await run_engine(tmp_path, lm)
    assert result.answer == "first"
    assert factory.opened[0].cells == ['answer["content"]="first"; answer["ready"]=True']


async def test_legacy_final_text_outside_fences(tmp_path: Path) -> None:
    lm = FakeChatModel(root=["I know it.\nFINAL(the answer is 2)"])
    result, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed" and result.answer == "the answer is 2"


async def test_prose_final_after_code_in_the_same_reply_is_refused(tmp_path: Path) -> None:
    # The model wrote code and, before it ran, an answer resting on output it could not know
    # (reference PR #127): the run goes on and the model is told why.
    invented = repl("print(len(context))") + "\nThe output is 5, so:\nFINAL(5)"
    lm = FakeChatModel(root=[invented, repl('answer["content"] = str(len(context)); answer["ready"] = True')])
    result, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed" and result.answer != "5" and result.iterations == 2
    output = lm.root_calls[1].messages[4]["content"]
    assert (
        output.startswith("REPL output:")
        and "FINAL(...) in the same reply as a ```repl``` block was not accepted" in output
    )


@pytest.mark.parametrize("ready", ['"False"', '"yes"', "0", "None", "[]"])
async def test_only_a_truthy_non_string_ready_ends_the_run(tmp_path: Path, ready: str) -> None:
    lm = FakeChatModel(
        root=[repl(f'answer["content"] = "draft"; answer["ready"] = {ready}'), repl('answer["ready"] = True')]
    )
    result, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed" and result.iterations == 2 and result.answer == "draft"


async def test_final_inside_code_is_not_final(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("s = 'FINAL(no)'\nprint(s)"), repl('answer["content"]="yes"; answer["ready"]=True')])
    result, *_ = await run_engine(tmp_path, lm)
    assert result.answer == "yes" and result.iterations == 2


async def test_final_var_resolves_in_sandbox(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("total = 7 * 6"), "I have it.\nFINAL_VAR(total)"])
    result, events, factory, _ = await run_engine(tmp_path, lm)
    assert result.status == "completed" and result.answer == "42"


async def test_final_var_unknown_name_tells_the_model(tmp_path: Path) -> None:
    lm = FakeChatModel(root=["FINAL_VAR(nope)", repl('answer["content"]="ok"; answer["ready"]=True')])
    result, *_ = await run_engine(tmp_path, lm)
    assert result.answer == "ok"
    assert "FINAL_VAR(nope) was not accepted" in lm.root_calls[1].messages[4]["content"]


def test_final_var_needs_an_identifier() -> None:
    found = find_legacy_final("FINAL_VAR(os.system('x'))")
    assert found is None or found.kind == "text"
    assert find_legacy_final("FINAL_VAR('name')").value == "name"  # type: ignore[union-attr]
    assert find_legacy_final("```\nFINAL(x)\n```") is None


def test_block_parsing() -> None:
    # An empty block is a block (it runs, showing "No output"), as in the reference and training.
    assert find_repl_blocks("```repl\n  a = 1  \n```\n```repl\n\n```") == ["a = 1", ""]
    assert has_unclosed_repl_block("ok\n```repl\nx = 1\n") is True
    assert has_unclosed_repl_block("```repl\nx = 1\n```") is False


async def test_answer_set_but_never_ready_is_returned_at_max_iterations(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl('answer["content"] = "draft"'), repl("print(1)"), repl("print(2)")])
    settings = make_settings(submit_on_max_iterations=False)
    result, *_ = await run_engine(tmp_path, lm, settings=settings, max_iterations=3)
    assert result.status == "max_iterations"
    assert result.answer == "draft"
    assert len(lm.root_calls) == 3
