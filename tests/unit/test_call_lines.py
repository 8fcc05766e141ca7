"""An LM call's `llm_call` event built as its line's values (`call_lines.call_line`) and encoded
without the event's model (`CallLine.line`, `store.event_lines.call_event_line`) is the event
the model made, and its log line the same bytes: over root and sub calls, failed, throttled,
retried and priced calls, odd strings and floats, lines over the cap; and through
`RunTree.emit_call`, whose events are compared with the model the engine built before."""

from __future__ import annotations

import inspect
import json
import time
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_mcp import events as ev
from rlm_mcp.call_lines import CallLine, call_line
from rlm_mcp.engine.tree import RunTree, Where
from rlm_mcp.engine.types import RunProgress
from rlm_mcp.ports.chat import CallRecord, Completion
from rlm_mcp.ports.run_values import RunLimits
from rlm_mcp.store.event_lines import call_event_line, event_line

TS = 1795462398.14241

ROOT: dict[str, Any] = {
    "run_id": "run_a",
    "role": "root",
    "model": "m",
    "prompt_tokens": 1200,
    "completion_tokens": 80,
    "latency_s": 0.8123,
    "finish_reason": "stop",
    "error": None,
    "depth": 0,
    "iteration": 2,
}
SUB: dict[str, Any] = {
    **ROOT,
    "role": "sub",
    "depth": 1,
    "block": 0,
    "batch": 3,
    "index": 15,
    "prompt": "é q ✓",
    "prompt_chars": 5,
    "answer": "ok",
    "answer_chars": 2,
}
FAILED: dict[str, Any] = {
    **SUB,
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "finish_reason": None,
    "error": "the server answered 429 four times",
    "answer": "Error: sub-LLM call failed: the server answered 429 four times",
    "answer_chars": 62,
    "retries": 3,
    "throttled": 4,
    "backoff_s": 1.75,
}
WAITED: dict[str, Any] = {**SUB, "cost_usd": 0.00123, "queued_s": 0.25, "retries": 1, "throttled": 1, "backoff_s": 0.5}
OUTSIDE_A_CELL: dict[str, Any] = {**ROOT, "role": "sub", "depth": 1, "iteration": None, "batch": 1, "index": 0}
VARIANTS = {"root": ROOT, "sub": SUB, "failed": FAILED, "waited": WAITED, "outside a cell": OUTSIDE_A_CELL}
ODD_STRINGS = [
    "",
    ":x",
    "x,",
    ',"',
    '":',
    'a","b":"c',
    "\\",
    '\\"',
    "\n\t\x00\x1f",
    "\u2028\u2029",
    "😀 é 中",
    "x" * 5000,
]
ODD_FLOATS = [0.0, -0.0, 1e-4, 9.999e-05, 1e-05, 5e-324, 1e16, 1e300, float("inf"), float("nan")]


def _model(values: dict[str, Any]) -> ev.LLMCall:
    """The event as the model the engine built before (status from the error, None fields given)."""
    return ev.LLMCall(status="ok" if values["error"] is None else "error", **values)


def _same(values: dict[str, Any], *, max_bytes: int = 1 << 20, monkeypatch: pytest.MonkeyPatch) -> bytes:
    call = call_line(**values)
    event = _model(values)
    assert call.event() == event
    assert call.answered == (event.error is None) and call.type == event.type
    assert call.fields == ev.to_json(event)
    fast = call.line(TS)
    assert fast is None or fast == json.dumps(ev.to_json(event, ts=TS), ensure_ascii=False).encode()
    assert fast is None or fast == ev.flat_line(event, ts=TS)
    monkeypatch.setattr(time, "time", lambda: TS)  # the line's stamp
    line = call_event_line(call, max_bytes)
    assert line == event_line(event, max_bytes)
    return line


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_writes_the_models_line(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    values = VARIANTS[name]
    assert call_line(**values).line(TS) is not None  # written without the model
    line = _same(values, monkeypatch=monkeypatch)
    assert ev.loads(line) == _model(values).model_copy(update={"ts": TS})


@pytest.mark.parametrize("text", ODD_STRINGS)
def test_odd_strings(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _same({**FAILED, "prompt": text, "answer": text[::-1], "error": text, "model": text}, monkeypatch=monkeypatch)


@pytest.mark.parametrize("value", ODD_FLOATS)
def test_floats_of_every_size(value: float, monkeypatch: pytest.MonkeyPatch) -> None:
    _same({**WAITED, "latency_s": value, "cost_usd": value, "queued_s": value}, monkeypatch=monkeypatch)


def test_ints_past_64_bits_and_an_int_price(monkeypatch: pytest.MonkeyPatch) -> None:
    _same({**SUB, "prompt_tokens": 1 << 70}, monkeypatch=monkeypatch)
    _same({**WAITED, "cost_usd": 2}, monkeypatch=monkeypatch)  # the model's float field: 2.0


def test_a_line_over_the_cap_is_cut_as_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    line = _same({**SUB, "prompt": "x" * 2000, "answer": "y" * 2000}, max_bytes=600, monkeypatch=monkeypatch)
    assert len(line) <= 600 and ev.loads(line).type == "llm_call"


def test_a_lone_surrogate_is_refused_as_the_models_line_is() -> None:
    call = call_line(**{**SUB, "prompt": "a\ud800b"})
    assert call.line(TS) is None
    with pytest.raises(UnicodeEncodeError):
        event_line(call.event(), 1 << 20)
    with pytest.raises(UnicodeEncodeError):
        call_event_line(call, 1 << 20)


def test_every_field_of_the_model_is_a_value_of_the_line() -> None:
    """A field added to `LLMCall` must be added to `call_line` too (or the lines would differ)."""
    derived = {"type", "status", "ts"}  # the kind, the error's status, the log's stamp
    assert set(inspect.signature(call_line).parameters) == set(ev.LLMCall.model_fields) - derived
    assert list(inspect.signature(call_line).parameters) == [n for n in ev.LLMCall.model_fields if n not in derived]
    assert set(ev.LLMCall.OMIT_WHEN_NONE) - {"ts"} <= set(inspect.signature(call_line).parameters)


_texts = st.none() | st.text(max_size=30) | st.sampled_from([":", ",", '"', '":', ',"', "é ✓"])
_numbers = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e-4, 1e16, 0.0, 0.25])


@settings(max_examples=150, deadline=None)
@given(
    prompt=_texts,
    answer=_texts,
    error=_texts,
    latency=st.floats(allow_nan=True, allow_infinity=True),
    waits=st.tuples(_numbers, _numbers, _numbers),
    counts=st.tuples(st.none() | st.integers(1, 9), st.none() | st.integers(1, 9)),
    slot=st.tuples(st.none() | st.integers(0, 9), st.none() | st.integers(0, 9)),
)
def test_any_call_gives_the_models_line(
    prompt: str | None,
    answer: str | None,
    error: str | None,
    latency: float,
    waits: tuple[float | None, float | None, float | None],
    counts: tuple[int | None, int | None],
    slot: tuple[int | None, int | None],
) -> None:
    cost, queued, backoff = waits
    values = {
        **SUB,
        "prompt": prompt,
        "answer": answer,
        "error": error,
        "latency_s": latency,
        "cost_usd": cost,
        "queued_s": queued,
        "backoff_s": backoff,
        "retries": counts[0],
        "throttled": counts[1],
        "batch": slot[0],
        "index": slot[1],
    }
    call = call_line(**values)
    event = _model(values)
    assert call.event() == event
    fast = call.line(TS)
    assert fast is None or fast == json.dumps(ev.to_json(event, ts=TS), ensure_ascii=False).encode()


# -- through the engine: `RunTree.emit_call` -----------------------------------------------------


def _tree(sink: Any, call_sink: Any) -> RunTree:
    limits = RunLimits(max_iterations=5, max_depth=1, timeout_s=60, token_budget=None, max_errors=3)
    return RunTree(
        progress=RunProgress(run_id="run_a", max_iterations=5),
        limits=limits,
        deadline=1e9,
        sink=sink,
        call_sink=call_sink,
        max_sub_calls=100,
        max_prompts_per_batch=100,
        max_concurrent_children=1,
    )


def _before(
    *,
    record: CallRecord | None,
    completion: Completion | None,
    error: str | None,
    latency_s: float,
    where: Where,
    **kw: Any,
) -> ev.LLMCall:
    """The event `RunTree.emit_call` built before (its model, as that code built it)."""
    waits: dict[str, Any] = {}
    if record is not None:
        if record.cost_usd is not None:
            waits["cost_usd"] = record.cost_usd
        if record.queued_s >= 0.001:
            waits["queued_s"] = round(record.queued_s, 3)
        if record.retries:
            waits["retries"] = record.retries
        if record.throttled:
            waits["throttled"] = record.throttled
        if backoff := round(record.backoff_s, 3):
            waits["backoff_s"] = backoff
    return ev.LLMCall(
        **kw,
        prompt_tokens=record.prompt_tokens if record else 0,
        completion_tokens=record.completion_tokens if record else 0,
        latency_s=round(latency_s, 4),
        status="ok" if error is None else "error",
        finish_reason=completion.finish_reason if completion is not None else None,
        error=error,
        iteration=where.iteration,
        block=where.block,
        batch=where.batch,
        index=where.index,
        **waits,
    )


LATENCY = 0.123456789
RECORDS = {
    "answered": CallRecord(model="m", prompt_tokens=10, completion_tokens=2, latency_s=0.1, status="ok", role="sub"),
    "priced and queued": CallRecord(
        model="m",
        prompt_tokens=10,
        completion_tokens=2,
        latency_s=0.1,
        status="ok",
        role="sub",
        cost_usd=1e-3,
        queued_s=0.0123,
    ),
    "throttled and retried": CallRecord(
        model="m",
        prompt_tokens=10,
        completion_tokens=2,
        latency_s=2.1,
        status="ok",
        role="sub",
        retries=2,
        throttled=2,
        backoff_s=1.23456,
    ),
    "failed after retries": CallRecord(
        model="m",
        prompt_tokens=0,
        completion_tokens=0,
        latency_s=3.0,
        status="error",
        role="sub",
        error="429",
        retries=3,
        throttled=4,
        backoff_s=2.5,
    ),
    "failed at once": None,
}


@pytest.mark.parametrize("name", list(RECORDS))
@pytest.mark.parametrize("where", [Where(iteration=1, block=0, batch=2, index=5), Where()])
def test_emit_call_sends_the_event_it_sent_before(name: str, where: Where, monkeypatch: pytest.MonkeyPatch) -> None:
    record = RECORDS[name]
    failed = name.startswith("failed")
    completion = None if failed or record is None else Completion(text="ok", finish_reason="stop", record=record)
    error = "the server answered 429" if failed else None
    args: dict[str, Any] = {"role": "sub", "run_id": "run_a", "model": "m", "depth": 1, "where": where}
    texts: dict[str, Any] = {"prompt": "q ✓", "prompt_chars": 3, "answer": "ok", "answer_chars": 2}
    events: list[ev.RunEvent] = []
    calls: list[CallLine] = []

    async def sink(event: ev.RunEvent) -> None:
        events.append(event)

    async def call_sink(call: CallLine) -> None:
        calls.append(call)

    async def emit(tree: RunTree) -> None:
        await tree.emit_call(
            **args, **texts, completion=completion, latency_s=LATENCY, error=error, failed=record if failed else None
        )

    anyio.run(emit, _tree(sink, None))
    anyio.run(emit, _tree(sink, call_sink))
    expected = _before(record=record, completion=completion, error=error, **args, **texts, latency_s=LATENCY)
    assert events == [expected]  # no call sink: the model, as before
    (call,) = calls
    assert call.event() == expected
    monkeypatch.setattr(time, "time", lambda: TS)  # the line's stamp
    assert call_event_line(call, 1 << 20) == event_line(expected, 1 << 20)


def test_a_failing_call_sink_is_logged_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    async def sink(event: ev.RunEvent) -> None:
        raise AssertionError("the call sink takes the event")

    async def broken(call: CallLine) -> None:
        raise OSError("disk full")

    async def emit() -> None:
        await _tree(sink, broken).emit_call(
            role="root", run_id="run_a", model="m", completion=None, latency_s=0.1, error="x", depth=0, where=Where()
        )

    anyio.run(emit)
    assert "event sink failed on llm_call event" in caplog.text
