"""`events.flat_line` (the log line of a flat event written by orjson) writes the bytes the
standard library writes for `to_json(event)`, or declines: for every code point, for floats of
every size, for strings that hold the separators, and for the lines of the old logs."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_mcp import events as ev
from rlm_mcp.store.event_lines import encode_event, event_line
from tests.event_samples import LLM_CALL_FIELDS
from tests.paths import TESTS


def _stdlib(event: ev.LoggedEvent, ts: float | None) -> bytes:
    return json.dumps(ev.to_json(event, ts=ts), ensure_ascii=False).encode()


def _same_or_declined(event: ev.LoggedEvent, ts: float | None = 1795462398.14241) -> bytes | None:
    line = ev.flat_line(event, ts=ts)
    assert line is None or line == _stdlib(event, ts)
    return line


def test_every_code_point_is_written_as_the_standard_library_writes_it() -> None:
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(points), 4096):
        text = "".join(points[start : start + 4096])
        line = _same_or_declined(ev.LLMCall(**LLM_CALL_FIELDS, prompt=text, answer=text[::-1]))
        if '"' not in text:  # a quote (escaped) may make a `":` inside the string: declined
            assert line is not None


def test_a_lone_surrogate_is_declined_and_the_log_refuses_it_as_before() -> None:
    event = ev.LLMCall(**LLM_CALL_FIELDS, prompt="a\ud800b")
    assert ev.flat_line(event, ts=1.0) is None
    with pytest.raises(UnicodeEncodeError):
        event_line(event, 1 << 20)


@pytest.mark.parametrize(
    "value",
    [0.0, -0.0, 1e-4, -1e-4, 9.999e-05, 1e-05, 5e-324, 0.1, 1.5, 1795462398.14241, 9999999999999998.0, 1e16, 1e300],
)
def test_floats_of_every_size(value: float) -> None:
    line = _same_or_declined(ev.LLMCall(**{**LLM_CALL_FIELDS, "latency_s": value}, queued_s=value))
    assert (line is not None) == (value == 0 or 1e-4 <= abs(value) < 1e16)


@pytest.mark.parametrize("text", [":x", "x,", ',"', '":', 'a","b":"c', "\\", '\\"', "x:", ",x"])
def test_strings_that_hold_the_separators(text: str) -> None:
    _same_or_declined(ev.LLMCall(**LLM_CALL_FIELDS, prompt=text, answer=text))


def test_what_is_not_flat_is_declined() -> None:
    assert ev.flat_line(ev.LLMCall(**LLM_CALL_FIELDS, newer_field={"kept": [1]}), ts=1.0) is None  # extra field
    assert ev.flat_line(ev.LLMCall(**{**LLM_CALL_FIELDS, "latency_s": math.inf}), ts=1.0) is None  # JSON mode: null
    assert ev.flat_line(ev.LLMCall(**{**LLM_CALL_FIELDS, "prompt_tokens": 1 << 70}), ts=1.0) is None  # past 64 bits
    assert ev.flat_line(ev.LogTruncated(max_bytes=10), ts=2.0) == _stdlib(ev.LogTruncated(max_bytes=10), 2.0)


_texts = st.text(max_size=40) | st.sampled_from(["", ":", ",", '"', "é ✓", "\n\t\x00"])
_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e-4, 1e16, 0.0, 0.0001234])
_ints = st.integers(min_value=-(1 << 70), max_value=1 << 70) | st.integers(min_value=0, max_value=10**6)


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.none() | _texts,
    answer=st.none() | _texts,
    error=st.none() | _texts,
    latency=_floats,
    tokens=_ints,
    ts=st.none() | _floats,
    batch=st.none() | _ints,
)
def test_any_call_event_gives_the_standard_librarys_line(
    prompt: str | None,
    answer: str | None,
    error: str | None,
    latency: float,
    tokens: int,
    ts: float | None,
    batch: int | None,
) -> None:
    event = ev.LLMCall(
        **{**LLM_CALL_FIELDS, "latency_s": latency, "prompt_tokens": tokens, "error": error},
        prompt=prompt,
        answer=answer,
        batch=batch,
        cost_usd=latency,
    )
    _same_or_declined(event, ts)


@pytest.mark.parametrize("run_id", ["run_fixture_full", "run_fixture_capped"])
def test_the_old_logs_lines_are_written_alike(run_id: str) -> None:
    """The lines the code of 822c879 wrote: each flat event's line comes back byte for byte
    (every `llm_call` and every turn's `turn_start`, `cell` and `turn` take the fast way, none
    of them is declined)."""
    fast = 0
    for line in (TESTS / "data" / "runlog_v0" / run_id / "events.jsonl").read_bytes().splitlines():
        event = ev.loads(line)
        got = ev.flat_line(event)
        assert got is None or got == line
        if isinstance(event, (ev.LLMCall, ev.Turn, ev.TurnStart, ev.Cell)):  # a turn's lines too
            assert got == line
            fast += 1
    assert fast


def test_the_log_writes_the_line_it_wrote_before() -> None:
    event = ev.LLMCall(
        **LLM_CALL_FIELDS, iteration=1, block=0, batch=2, index=7, prompt="é q", prompt_chars=3, answer="a"
    )
    before = time.time()
    line = event_line(event, 1 << 20)
    stamped = json.loads(line)["ts"]
    assert before <= stamped <= time.time()
    assert line == encode_event(ev.to_json(event, ts=stamped), 1 << 20)
    # Over the cap: the standard library's way, strings cut.
    capped = event_line(ev.LLMCall(**LLM_CALL_FIELDS, prompt="x" * 2000), 600)
    assert len(capped) <= 600 and ev.loads(capped).type == "llm_call"


def _turn(*contents: str, role: str = "user") -> ev.Turn:
    messages = [ev.ChatMessage(role=role, content=c) for c in contents]
    return ev.Turn(run_id="r1", iteration=2, depth=0, new_messages=messages)


def test_a_turns_messages_are_written_as_the_standard_library_writes_them() -> None:
    for contents in [(), ("one",), ("é ✓\n", "```repl\nprint(1)\n```", "third")]:
        assert _same_or_declined(_turn(*contents)) is not None
    assert _same_or_declined(_turn("a", "b"), ts=None) is not None


@pytest.mark.parametrize("text", ["},{", "x}", "{x", '"},{"', "}, {", '":', ',"', "\\", ":x", "x,"])
def test_a_turns_messages_that_hold_the_separators(text: str) -> None:
    _same_or_declined(_turn(text, "plain"))
    _same_or_declined(_turn("plain", text, role=text))


def test_a_turn_past_what_orjson_writes_alike_is_declined() -> None:
    assert ev.flat_line(_turn("a\ud800b"), ts=1.0) is None  # a lone surrogate: the log refuses it as before
    extra = ev.Turn(run_id="r1", iteration=2, depth=0, new_messages=[], newer_field=[1])
    assert ev.flat_line(extra, ts=1.0) is None
    run_start = ev.RunStart(
        run_id="r1",
        depth=0,
        query="q",
        contexts=[],
        limits=ev.LimitsRecord(max_iterations=1, max_depth=1, timeout_s=1, token_budget=None, max_errors=1),
        model="m",
        sub_model="m",
        prompt_profile="p",
    )
    assert ev.flat_line(run_start, ts=1.0) is None  # a record that is no list


@settings(max_examples=300, deadline=None)
@given(
    contents=st.lists(_texts, max_size=4),
    role=_texts,
    ts=st.none() | _floats,
)
def test_any_turn_gives_the_standard_librarys_line(contents: list[str], role: str, ts: float | None) -> None:
    _same_or_declined(_turn(*contents, role=role), ts)
