"""The root window: elision oldest first, in large steps, prefix stability, length rejections."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.engine.messages import History
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.engine.window import fit_history, token_upper_bound
from rlm_mcp.ports.chat import LMContextLengthError
from tests.fixtures_engine import FakeChatModel, count_tokens, make_settings, repl, run_engine

pytestmark = pytest.mark.anyio


def _is_prefix(a: list[dict[str, str]], b: list[dict[str, str]]) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


def _stable_pairs(lm: FakeChatModel) -> list[bool]:
    calls = lm.root_calls
    return [_is_prefix(calls[i].messages, calls[i + 1].messages) for i in range(len(calls) - 1)]


async def test_many_turns_of_20000_char_outputs_fit_the_window(tmp_path: Path) -> None:
    turns = 14
    lm = FakeChatModel(root=[repl(f"print('{i}' * 25000)") for i in range(turns)])
    settings = make_settings(submit_on_max_iterations=False)
    result, events, _, progress = await run_engine(
        tmp_path, lm, settings=settings, system_prompt=RLM_MCP_SYSTEM_PROMPT, max_iterations=turns
    )
    assert result.status == "max_iterations"  # never an error: no request was too long
    calls = lm.root_calls
    assert len(calls) == turns
    for call in calls:
        assert count_tokens(call.messages) + call.max_tokens <= 16384
        assert call.max_tokens == 4096  # the full completion budget was always kept
        assert call.messages[0]["content"] == RLM_MCP_SYSTEM_PROMPT
        assert call.messages[1]["content"].startswith("Answer the following:")
    elided = events.of("history_elided")
    assert elided
    last = calls[-1].messages
    # oldest outputs are the ones elided; the newest output is intact (apart from the 20k cut)
    outputs = [
        i
        for i, m in enumerate(last)
        if m["role"] == "user" and m["content"].startswith(("REPL output", "[REPL output"))
    ]
    assert last[outputs[0]]["content"].startswith("[REPL output of an earlier turn removed")
    assert last[outputs[-1]]["content"].startswith("REPL output:\n")
    kept = [i for i in outputs if last[i]["content"].startswith("REPL output:")]
    assert kept == outputs[-len(kept) :]  # kept ones are the newest
    # every turn message and reply survives (only outputs were needed)
    assert sum(1 for m in last if m["content"].startswith("Turn ") or "Turn 1/" in m["content"]) == turns
    # the prefix is byte-identical for about half of the turns, despite 5k-token outputs
    stable = _stable_pairs(lm)
    assert sum(stable) >= len(stable) // 2 - 1
    assert progress.elided_messages > 0


async def test_prefix_stays_stable_for_several_turns(tmp_path: Path) -> None:
    turns = 16
    lm = FakeChatModel(root=[repl(f"print('{i % 10}' * 5000)") for i in range(turns)])
    settings = make_settings(submit_on_max_iterations=False)
    result, events, *_ = await run_engine(tmp_path, lm, settings=settings, max_iterations=turns)
    assert result.status == "max_iterations"
    stable = _stable_pairs(lm)
    elisions = len(events.of("history_elided"))
    assert 1 <= elisions <= 4
    # between two elisions the conversation only grows: runs of >= 3 prefix-stable turns
    runs, current = [], 0
    for ok in stable:
        current = current + 1 if ok else 0
        runs.append(current)
    assert max(runs) >= 3
    assert sum(stable) == len(stable) - elisions


async def test_newest_output_too_big_is_cut(tmp_path: Path) -> None:
    blocks = "\n".join(repl(f"print('{i}' * 30000)") for i in range(4))
    lm = FakeChatModel(root=[blocks, repl('answer["content"]="k"; answer["ready"]=True')])
    result, events, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed"
    call = lm.root_calls[1]
    assert count_tokens(call.messages) + call.max_tokens <= 16384
    assert "[output cut to fit the context window" in call.messages[4]["content"]
    assert events.of("history_elided")[0]["cut_newest"] is True


async def test_completion_budget_shrinks_only_down_to_the_floor(tmp_path: Path) -> None:
    # A huge system prompt leaves less than the floor: the run ends with an error, nothing sent.
    lm = FakeChatModel(root=[repl("print(1)")])
    result, *_ = await run_engine(tmp_path, lm, system_prompt="x" * 4 * 15500)
    assert result.status == "error" and "context window too small" in (result.reason or "")
    assert lm.root_calls == []
    # A large one that still leaves more than the floor: the budget shrinks.
    lm2 = FakeChatModel(root=[repl('answer["content"]="f"; answer["ready"]=True')])
    result2, *_ = await run_engine(tmp_path, lm2, system_prompt="x" * 4 * 14000)
    assert result2.status == "completed"
    assert 1024 <= lm2.root_calls[0].max_tokens < 4096


async def test_length_rejection_shrinks_and_retries_once(tmp_path: Path) -> None:
    # Our counter under-reports (as a chars/4 estimate can): the server rejects, we elide harder.
    replies = [repl(f"print('{i}' * 20000)") for i in range(4)] + [repl('answer["content"]="ok"; answer["ready"]=True')]
    lm = FakeChatModel(root=replies, count_skew=0.7)
    result, events, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed"
    rejected = [e for e in events.of("llm_call") if e["status"] == "error"]
    assert len(rejected) == 1  # one request was refused, then the retry fitted
    assert events.of("history_elided")
    retry = lm.root_calls[-1]
    assert retry.max_tokens < 4096


async def test_length_rejection_twice_ends_with_error(tmp_path: Path) -> None:
    def always_reject(messages: list[dict[str, str]], index: int) -> BaseException:
        return LMContextLengthError("maximum context length is 16384 tokens", endpoint="http://fake/v1", status=400)

    lm = FakeChatModel(root=always_reject)
    result, *_ = await run_engine(tmp_path, lm)
    assert result.status == "error"
    assert "maximum context length is 16384 tokens" in (result.reason or "")
    assert len(lm.root_calls) == 2


async def test_exact_count_only_when_the_byte_bound_does_not_surely_fit() -> None:
    counted: list[int] = []

    def tokenizer(messages: list[dict[str, str]]) -> int:
        counted.append(len(messages))
        return count_tokens(messages)

    lm = FakeChatModel(tokenizer=tokenizer)
    history = History()
    history.add("system", "s" * 1000, "system", 0)
    history.add("user", "é" * 500, "metadata", 0)
    fit = await fit_history(history, lm, model="m", window=4000, max_tokens=1000, floor=100)
    assert counted == [] and fit.max_tokens == 1000
    assert fit.prompt_tokens == token_upper_bound(history.messages) >= 1000 + 1000  # "é" is 2 bytes
    history.add("user", "x" * 3000, "turn", 1)  # bound over the limit, real count under it
    fit = await fit_history(history, lm, model="m", window=4000, max_tokens=1000, floor=100)
    assert counted == [3] and fit.prompt_tokens == count_tokens(history.messages) and not fit.elided
