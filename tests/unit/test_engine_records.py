"""What the run log records of sub-calls: prompt and answer (head and tail under a cap, full
lengths), model, tokens, latency and status, the cell and batch that made them, child links."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.ports.chat import LMServerError
from tests.fixtures_engine import FakeChatModel, make_settings, repl, run_engine

pytestmark = pytest.mark.anyio

DONE = repl('answer["content"]="done"; answer["ready"]=True')


def _sub(prompt: str) -> str | BaseException:
    if prompt.startswith("fail"):
        return LMServerError("HTTP 503 after retries", endpoint="http://fake/v1")
    return "ANSWER:" + prompt.upper()


async def test_sub_calls_record_prompt_answer_cell_and_batch(tmp_path: Path) -> None:
    long_prompt = "HEAD" + "x" * 5000 + "TAIL"
    code = f"a = llm_query({long_prompt!r})\nb = llm_query_batched(['p1', 'fail-p2'])\nprint(len(a), b)"
    lm = FakeChatModel(root=[repl(code), DONE], sub=_sub)
    settings = make_settings(log_sub_call_chars=200)
    result, events, *_ = await run_engine(tmp_path, lm, settings=settings)
    assert result.status == "completed"
    subs = [e for e in events.of("llm_call") if e["role"] == "sub"]
    assert len(subs) == 3
    big = next(e for e in subs if e["prompt_chars"] == len(long_prompt))
    # head and tail kept, the middle cut, the full length recorded
    assert big["prompt"].startswith("HEAD") and big["prompt"].endswith("TAIL") and len(big["prompt"]) < 260
    assert big["answer_chars"] == len("ANSWER:") + len(long_prompt) and big["answer"].startswith("ANSWER:HEAD")
    assert big["status"] == "ok" and big["model"] == "rlm-v0.1" and big["prompt_tokens"] > 0
    assert big["latency_s"] >= 0 and (big["iteration"], big["block"]) == (1, 1)
    failed = next(e for e in subs if e["prompt"] == "fail-p2")
    assert failed["status"] == "error" and failed["answer"].startswith("Error: sub-LLM call failed")
    ok = next(e for e in subs if e["prompt"] == "p1")
    assert ok["answer"] == "ANSWER:P1"
    # each call names its batch and slot; the batch event names the cell and its calls' batch
    batches = events.of("sub_calls")
    assert [b["batch"] for b in batches] == [big["batch"], ok["batch"]]
    assert {(ok["batch"], ok["index"]), (failed["batch"], failed["index"])} == {(ok["batch"], 0), (ok["batch"], 1)}
    assert {(b["iteration"], b["block"]) for b in batches} == {(1, 1)}
    assert batches[1]["count"] == 2 and batches[1]["failed"] == 1 and batches[1]["duration_s"] >= 0
    # the cell's start is logged before its sub-calls; root calls name their turn
    kinds = [e["type"] for e in events.items]
    assert kinds.index("cell_start") < kinds.index("sub_calls") < kinds.index("cell")
    assert [e["iteration"] for e in events.of("llm_call") if e["role"] == "root"] == [1, 2]


async def test_cap_zero_records_lengths_only(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("print(llm_query('secretive prompt'))"), DONE], sub=_sub)
    _, events, *_ = await run_engine(tmp_path, lm, settings=make_settings(log_sub_call_chars=0))
    call = next(e for e in events.of("llm_call") if e["role"] == "sub")
    assert "secretive" not in call["prompt"] and call["prompt_chars"] == len("secretive prompt")


def _root_with_child(messages: list[dict[str, str]], index: int) -> str:
    if not messages[1]["content"].startswith("Answer the following"):
        return repl('answer["content"] = "child:" + context\nanswer["ready"] = True')
    if sum(1 for m in messages if m["role"] == "assistant") == 0:
        return repl("print(rlm_query_batched(['alpha', 'beta']))")
    return DONE


async def test_child_runs_are_linked_to_parent_cell_and_batch(tmp_path: Path) -> None:
    lm = FakeChatModel(root=_root_with_child)
    result, events, *_ = await run_engine(tmp_path, lm, max_depth=2)
    assert result.status == "completed"
    starts = sorted(events.of("child_start"), key=lambda e: e["index"])
    assert [s["prompt"] for s in starts] == ["alpha", "beta"]
    assert {s["parent_run_id"] for s in starts} == {result.run_id}
    assert {(s["iteration"], s["block"]) for s in starts} == {(1, 1)}
    batch = events.of("sub_calls")
    parent_batch = next(b for b in batch if b["run_id"] == result.run_id)
    assert {s["batch"] for s in starts} == {parent_batch["batch"]} and parent_batch["kind"] == "rlm"
    ends = {e["child_run_id"]: e for e in events.of("child_end")}
    assert ends[starts[0]["child_run_id"]]["answer"] == "child:alpha"
    # the child's own events carry its id, and its cells are its own
    child_cells = [e for e in events.of("cell") if e["run_id"] == starts[1]["child_run_id"]]
    assert child_cells and all(e["depth"] == 1 for e in child_cells)
