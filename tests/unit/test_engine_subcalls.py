"""Sub-calls through the bridge, recursion depth, and exact usage over the tree."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rlm_mcp.engine import children as children_module
from rlm_mcp.ports.chat import LMServerError
from tests.fixtures_engine import FakeChatModel, count_tokens, make_settings, repl, run_engine

pytestmark = pytest.mark.anyio

DONE = repl('answer["content"]="done"; answer["ready"]=True')


def _sub(prompt: str) -> str | BaseException:
    if prompt.startswith("fail"):
        return LMServerError("HTTP 503 after retries", endpoint="http://fake/v1")
    return prompt.upper()


async def test_llm_query_batched_is_ordered_and_failures_are_strings(tmp_path: Path) -> None:
    code = "r = llm_query_batched(['a', 'fail-b', 'c'])\nprint(r)"
    lm = FakeChatModel(root=[repl(code), DONE], sub=_sub)
    result, events, *_ = await run_engine(tmp_path, lm)
    out = lm.root_calls[1].messages[4]["content"]
    assert "['A', 'Error: sub-LLM call failed: HTTP 503 after retries', 'C']" in out
    batch = events.of("sub_calls")[0]
    assert batch["count"] == 3 and batch["failed"] == 1 and batch["total_sub_calls"] == 3
    assert result.status == "completed" and result.sub_calls == 3
    assert all(c.messages == [{"role": "user", "content": c.messages[0]["content"]}] for c in lm.sub_calls)
    assert {c.model for c in lm.sub_calls} == {"rlm-v0.1"}
    assert {c.max_tokens for c in lm.sub_calls} == {4096}


async def test_sub_model_and_unknown_model_falls_back(tmp_path: Path) -> None:
    settings = make_settings(sub_model="small")
    lm = FakeChatModel(root=[repl("print(llm_query('x', model='gpt-9'), llm_query('y', model='rlm-v0.1'))"), DONE])
    await run_engine(tmp_path, lm, settings=settings)
    assert [c.model for c in lm.sub_calls] == ["small", "rlm-v0.1"]


async def test_tree_call_limit_answers_with_errors(tmp_path: Path) -> None:
    # The call cap's one owner is the run tree (the batch cap is the sandbox gate's: see
    # tests/e2e/test_e2e_subcall_policy.py, through Docker).
    settings = make_settings(max_sub_calls_per_run=3)
    code = "print(llm_query_batched(['a','b'])[1])\nprint(llm_query_batched(['c','d'])[1])\nprint(llm_query('z'))"
    lm = FakeChatModel(root=[repl(code), DONE])
    result, *_ = await run_engine(tmp_path, lm, settings=settings)
    out = lm.root_calls[1].messages[4]["content"]
    assert out.count("limit of 3 sub-calls is reached") == 2
    assert len(lm.sub_calls) == 3


async def test_sub_prompt_too_large_for_window_is_an_error_string(tmp_path: Path) -> None:
    settings = make_settings(sub_model="small")
    lm = FakeChatModel(
        root=[repl("print(llm_query('w ' * 20000))\nprint(llm_query('q ' * 2000))"), DONE], windows={"small": 4000}
    )
    result, *_ = await run_engine(tmp_path, lm, settings=settings)
    out = lm.root_calls[1].messages[4]["content"]
    assert "Error: this prompt is" in out and "window is 4000 tokens" in out
    assert len(lm.sub_calls) == 1  # the big one was never sent
    sent = lm.sub_calls[0]
    assert sent.max_tokens == 4000 - count_tokens(sent.messages)  # clamped to the window
    meta = lm.root_calls[0].messages[1]["content"]
    assert "roughly ~2k tokens" in meta  # the sub window, not the reference's fixed ~100k


async def test_max_depth_1_rlm_query_is_llm_query(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("print(rlm_query('sub task'))"), DONE])
    result, events, factory, _ = await run_engine(tmp_path, lm, max_depth=1)
    assert len(factory.opened) == 1
    assert len(lm.sub_calls) == 1 and "sub[sub task]" in lm.root_calls[1].messages[4]["content"]
    assert not events.of("child_start")
    assert events.of("sub_calls")[0]["kind"] == "llm"


def _root_with_child(messages: list[dict[str, str]], index: int) -> str:
    meta = messages[1]["content"]
    is_child = not meta.startswith("Answer the following")
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if is_child:
        if turn == 0:
            return repl("print(context[:40])")
        return repl('answer["content"] = "child saw: " + context[:9]\nanswer["ready"] = True')
    if turn == 0:
        return repl("r = rlm_query('summarize this text please')\nprint(r)")
    return repl('answer["content"] = r\nanswer["ready"] = True')


async def test_max_depth_2_runs_a_child_and_counts_its_usage(tmp_path: Path) -> None:
    lm = FakeChatModel(root=_root_with_child)
    result, events, factory, progress = await run_engine(tmp_path, lm, max_depth=2)
    assert result.status == "completed"
    assert result.answer == "child saw: summarize"
    assert len(factory.opened) == 2 and factory.closed == 2
    assert factory.opened[1].ns["context"] == "summarize this text please"
    assert [e["status"] for e in events.of("child_end")] == ["completed"]
    assert len(events.of("run_end")) == 2
    # 4 root-role calls: 2 parent + 2 child; all in the tree's usage
    assert result.usage.to_dict()["total"]["calls"] == len(lm.calls) == 4
    assert result.usage.to_dict()["total"]["prompt_tokens"] == sum(count_tokens(c.messages) for c in lm.calls)
    assert progress.children == 1 and result.sub_calls == 1


async def test_usage_is_exact(tmp_path: Path) -> None:
    settings = make_settings(sub_model="small")
    lm = FakeChatModel(root=[repl("print(llm_query_batched(['aaaa', 'bbbbbbbb']))"), DONE])
    result, *_ = await run_engine(tmp_path, lm, settings=settings)
    by_model = result.usage.to_dict()["by_model"]
    assert set(by_model) == {"rlm-v0.1", "small"}
    subs = lm.sub_calls
    assert by_model["small"]["calls"] == 2
    assert by_model["small"]["prompt_tokens"] == sum(count_tokens(c.messages) for c in subs)
    root_prompt = sum(count_tokens(c.messages) for c in lm.root_calls)
    first_two = [r for r in lm.root[:2] if isinstance(r, str)] if isinstance(lm.root, list) else []
    assert len(first_two) == 2
    assert by_model["rlm-v0.1"] == {
        "prompt_tokens": root_prompt,
        "completion_tokens": sum(len(r) // 4 + 1 for r in first_two),
        "calls": 2,
    }
    total = result.usage.to_dict()["total"]
    assert total["calls"] == 4
    assert total["prompt_tokens"] == by_model["small"]["prompt_tokens"] + root_prompt


def _root_with_children(messages: list[dict[str, str]], index: int) -> str:
    meta = messages[1]["content"]
    if not meta.startswith("Answer the following"):
        return repl('answer["content"] = context.upper()\nanswer["ready"] = True')
    if sum(1 for m in messages if m["role"] == "assistant") == 0:
        return repl("rs = rlm_query_batched(['one', 'two', 'three'])\nprint(rs)")
    return repl('answer["content"] = ",".join(rs)\nanswer["ready"] = True')


async def test_rlm_query_batched_runs_children(tmp_path: Path) -> None:
    lm = FakeChatModel(root=_root_with_children)
    result, events, factory, progress = await run_engine(tmp_path, lm, max_depth=2)
    assert result.answer == "ONE,TWO,THREE"
    assert len(factory.opened) == 4 and factory.closed == 4
    assert sorted(e["child_run_id"] for e in events.of("child_end")) == ["run-1.1", "run-1.2", "run-1.3"]
    assert result.usage.to_dict()["total"]["calls"] == 5
    assert events.of("sub_calls")[0]["kind"] == "rlm"


async def test_children_at_max_depth_use_llm_query(tmp_path: Path) -> None:
    def script(messages: list[dict[str, str]], index: int) -> str:
        if not messages[1]["content"].startswith("Answer the following"):
            return repl('answer["content"] = rlm_query("leaf")\nanswer["ready"] = True')
        if sum(1 for m in messages if m["role"] == "assistant") == 0:
            return repl("r = rlm_query('mid')")
        return repl('answer["content"] = r\nanswer["ready"] = True')

    lm = FakeChatModel(root=script)
    result, events, factory, _ = await run_engine(tmp_path, lm, max_depth=2)
    assert result.answer == "sub[leaf]"
    assert len(factory.opened) == 2  # the child's rlm_query did not start a grandchild


async def test_a_sub_call_rejected_for_length_still_counts_as_a_call(tmp_path: Path) -> None:
    # Our count under-reports, so the sub-prompt passes the pre-check and the server rejects it.
    # Every other failed call (root or sub) is in usage.calls; this one must be too.
    settings = make_settings(sub_model="small")
    lm = FakeChatModel(root=[repl("print(llm_query('w ' * 5000))"), DONE], windows={"small": 4000}, count_skew=0.5)
    result, events, *_ = await run_engine(tmp_path, lm, settings=settings)
    assert "too large for the sub-LLM's window" in lm.root_calls[1].messages[4]["content"]
    assert len(lm.sub_calls) == 1
    assert result.usage.to_dict()["total"]["calls"] == len(lm.calls) == len(events.of("llm_call"))
    assert result.usage.to_dict()["by_model"]["small"]["calls"] == 1


async def test_sub_prompt_precheck_counts_bytes_not_chars(tmp_path: Path) -> None:
    # Byte-level BPE can spend several tokens on one non-ASCII character, so a prompt with fewer
    # characters than the room left may still not fit: it must be counted, refused before it is
    # sent (or clamped), never sent blind with the full completion budget.
    def byte_tokens(messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"].encode("utf-8")) + 4 for m in messages) + 3

    settings = make_settings(sub_model="small")
    code = "print(llm_query('\U0001f600' * 9000))"  # 9,000 chars, 36,000 bytes/tokens
    lm = FakeChatModel(root=[repl(code), DONE], windows={"small": 20000}, tokenizer=byte_tokens)
    result, *_ = await run_engine(tmp_path, lm, settings=settings)
    out = lm.root_calls[1].messages[4]["content"]
    assert "Error: this prompt is" in out and "window is 20000 tokens" in out, out
    assert len(lm.sub_calls) == 0  # refused before sending


async def test_no_child_rlm_starts_once_the_token_budget_is_spent(tmp_path: Path) -> None:
    # The budget spans the tree: once it is spent, rlm_query must not start children that
    # each make a full root call (llm_query already refuses at that point).
    parent = repl("x = llm_query('hi ' * 2000)\nprint(rlm_query_batched(['a', 'b', 'c', 'd', 'e', 'f']))")

    def root(messages: list[dict[str, str]], index: int) -> str:
        if messages[1]["content"].startswith("Answer the following"):
            return parent
        return DONE

    lm = FakeChatModel(root=root, sub=lambda p: "s" * 4000)
    result, events, *_ = await run_engine(tmp_path, lm, max_depth=2, token_budget=2000)
    assert result.status == "budget_exceeded"
    child_roots = [c for c in lm.root_calls if not c.messages[1]["content"].startswith("Answer the following")]
    assert child_roots == []
    assert result.usage.to_dict()["total"]["calls"] == len(lm.calls)


@pytest.mark.parametrize(("size", "in_loop"), [(100, True), (70_000, False)])
async def test_a_childs_prompt_file_is_written_on_the_loop_unless_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, in_loop: bool
) -> None:
    """A small prompt's file is written without a worker-thread hop (each child of a batch
    waited for its own); a large one still goes to a thread. Either way the child reads it as
    its context and the file is gone after the child."""
    written: list[tuple[Path, bool]] = []
    write = children_module._write_temp_context

    def recorded(data: bytes) -> Path:
        path = write(data)
        written.append((path, threading.current_thread() is threading.main_thread()))
        return path

    monkeypatch.setattr(children_module, "_write_temp_context", recorded)

    def script(messages: list[dict[str, str]], index: int) -> str:
        if not messages[1]["content"].startswith("Answer the following"):
            return repl('answer["content"] = str(len(context))\nanswer["ready"] = True')
        if sum(1 for m in messages if m["role"] == "assistant") == 0:
            return repl(f"r = rlm_query('x' * {size})\nprint(r)")
        return repl('answer["content"] = r\nanswer["ready"] = True')

    result, _, factory, _ = await run_engine(tmp_path, FakeChatModel(root=script), max_depth=2)
    assert result.answer == str(size)
    assert factory.opened[1].ns["context"] == "x" * size
    assert [on_loop for _, on_loop in written] == [in_loop]
    assert not written[0][0].exists()
