"""The sub-call path's cheaper forms give what the plain ones gave: request ids, request bodies,
reply bodies, budgets, valid text, log lines and the LM span while no tracer is installed."""

from __future__ import annotations

import json
import math
import os
import uuid
import warnings
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import trace

from rlm_mcp.lm.http import HttpReply, _plain, decode_json, encode_json
from rlm_mcp.lm.length_field import set_budget
from rlm_mcp.lm.responses import parse_completion
from rlm_mcp.lm.routing import request_id
from rlm_mcp.observability import tracing
from rlm_mcp.ports.chat import LMMalformedResponseError
from rlm_mcp.ports.text import LONE_SURROGATE, REPLACEMENT, valid_text
from rlm_mcp.store.event_lines import encode_event


def test_request_ids_are_fresh_version_4_uuids() -> None:
    ids = [request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, rid)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_process_does_not_repeat_its_parents_request_ids() -> None:
    # The ids come from `random` (not the OS per call): a forked worker must not inherit the
    # parent's sequence.
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns on fork in a process with threads (a test run may hold some); the
        # child only draws ids, writes them and exits, taking no lock another thread could hold.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its next ids, then out at once (no test machinery in a fork)
        os.write(write_end, " ".join(request_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write_end)
    try:
        mine = [request_id() for _ in range(3)]
        with os.fdopen(read_end, "rb") as pipe:
            theirs = pipe.read().decode().split()
    finally:
        os.waitpid(pid, 0)
    assert len(theirs) == 3 and not set(theirs) & set(mine)


def test_a_request_body_is_the_compact_utf8_json_it_was() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": 'héllo ✓ "q"\n'}], "temperature": 0.7, "n": 1}
    expected = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    assert encode_json(body) == expected
    with pytest.raises(ValueError):
        encode_json({"temperature": math.nan})


@pytest.mark.parametrize("max_bytes", [1 << 20, 300, 80])
def test_a_log_line_is_the_line_it_was(max_bytes: int) -> None:
    event = {"type": "llm_call", "prompt": "é" * 400, "answer": "x" * 100, "n": 3, "other": object()}
    line = encode_event(event, max_bytes)
    assert line.endswith(b"\n") and len(line) <= max_bytes
    if max_bytes == 1 << 20:
        assert line == (json.dumps(event, ensure_ascii=False, default=str) + "\n").encode()


def test_the_lm_span_without_a_tracer_is_the_invalid_span_and_lets_errors_through() -> None:
    tracing.use_tracer_provider(None)
    assert not tracing.enabled()
    with tracing.lm_span(model="m", role="sub", endpoint="root", max_tokens=8) as span:
        assert span is trace.INVALID_SPAN
    with pytest.raises(KeyError), tracing.lm_span(model="m", role="sub", endpoint="root", max_tokens=8):
        raise KeyError("x")


# What servers send, and what they should not: every body `decode_json` takes through orjson or
# hands to the standard library must come back as `json.loads` gives it, errors included.
_BODIES = [
    b'{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": 8}}',
    '{"a": "héllo ✓", "b": [1, -0, -0.0, 0.1, 1E5, 5e-324, 1.7976931348623157e308]}'.encode(),
    b'{"a": 1, "a": 2}',  # a repeated key: the last one
    b'\xef\xbb\xbf{"bom": true}',  # a UTF-8 byte-order mark
    '{"utf16": 1}'.encode("utf-16"),  # not UTF-8 at all
    b'"\\ud83d"',  # a lone surrogate's escape: a str holding it (the parser's caller replaces it)
    b'{"usage": {"prompt_tokens": 123456789012345678901234567890}}',  # an integer past 64 bits
    b'{"n": -9999999999999999999}',
    b'{"n": 18446744073709551615}',
    b"[NaN, Infinity, -Infinity, 1e400]",
    b"",
    b"not json",
    b'{"a": 1,}',
    b'{"a": 1} trailing',
    b'"a\nb"',  # a raw control character in a string
    b'"\xc3\x28"',  # invalid UTF-8
    b"[" * 5000 + b"]" * 5000,  # nested past the standard library's recursion limit
]


def _outcome(decode: Any, body: bytes) -> tuple[str, str]:
    try:
        value = decode(body)
    except Exception as exc:  # the error itself is what is compared
        return type(exc).__name__, str(exc)
    return type(value).__name__, repr(value)


@pytest.mark.parametrize("body", _BODIES)
def test_a_reply_body_decodes_as_the_standard_library_decodes_it(body: bytes) -> None:
    assert _outcome(decode_json, body) == _outcome(json.loads, body)


def test_a_reply_that_is_not_json_is_still_named_so() -> None:
    reply = HttpReply("http://lm.test/v1/chat/completions", 200, CIMultiDictProxy(CIMultiDict()), b"<html>oops")
    with pytest.raises(LMMalformedResponseError, match="not JSON: '<html>oops'"):
        parse_completion(reply, [{"role": "user", "content": "q"}], "m", "sub", 0.0, 0.0)


def test_a_budget_replaces_either_field_in_the_bodys_order() -> None:
    body = {"temperature": 0.1, "max_tokens": 5, "model": "m", "max_completion_tokens": 6, "stream": False}
    out = set_budget(body, "max_completion_tokens", 0)
    assert list(out.items()) == [("temperature", 0.1), ("model", "m"), ("stream", False), ("max_completion_tokens", 1)]
    assert body["max_tokens"] == 5  # the given body is left as it was


@pytest.mark.parametrize("text", ["", "plain ascii", "héllo ✓", "half \ud83d of it", "\udfff\ud800"])
def test_text_is_made_valid_as_the_pattern_makes_it(text: str) -> None:
    assert valid_text(text) == LONE_SURROGATE.sub(REPLACEMENT, text)


@pytest.mark.anyio
async def test_a_slot_is_taken_at_once_when_free_and_a_cancelled_waiter_leaves_none_taken() -> None:
    from anyio.lowlevel import checkpoint

    from rlm_mcp.lm.completions import _take

    slots = anyio.Semaphore(1, fast_acquire=True)
    await _take(slots)
    assert slots.value == 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(_take, slots)
        await anyio.wait_all_tasks_blocked()  # the second taker waits in line
        tg.cancel_scope.cancel()
    slots.release()
    assert slots.value == 1
    with anyio.CancelScope() as scope:
        scope.cancel()
        await _take(slots)  # free: taken without a checkpoint, as before the request's own
        await checkpoint()  # the cancellation lands at the next one
    assert scope.cancelled_caught and slots.value == 0


class _Str(str):
    """A str subclass: orjson would write it, the standard library writes it as its str."""

    __slots__ = ()


class _Float(float):
    """A float subclass: left to the standard library."""

    __slots__ = ()


def _nested(depth: int) -> list[Any]:
    value: list[Any] = ["x"]
    for _ in range(depth):
        value = [value]
    return value


_REQUEST_BODIES: list[Any] = [
    {"model": "m", "messages": [{"role": "user", "content": "q0 1"}], "stream": False, "max_tokens": 4096},
    {"model": "m", "messages": [{"role": "user", "content": "".join(map(chr, range(0x7F))) + "é ✓ \u2028 😀"}]},
    {"temperature": 0.7, "top_p": 1e-7, "penalty": 1e16, "model": "m"},  # floats: the standard library's digits
    {"n": 2**64, "m": -(2**63) - 1, "k": 2**63},  # past 64 bits, and just inside
    {"vllm_xargs": {"agentic_context": {"program_id": "run_1", "expected_resume": True, "blocks": None}}},
    {"stop": ("a", "b")},  # a tuple
    {1: "int key", None: "none key"},
    {"content": "half \ud83d"},  # a lone surrogate: the UnicodeEncodeError it always raised
    {"temperature": math.nan},  # ValueError, as before
    {"deep": _nested(300)},  # past orjson's nesting limit
    {"obj": object()},  # not JSON at all
    # What a list's dicts (chat messages) hold: checked in place, as deep as elsewhere.
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}, "plain"]},
    {"messages": [{"role": "user", "weight": 1e16}]},  # a float in a message
    {"messages": [{"role": "user", "content": "ok"}, {2: "int key"}]},
    {"messages": [{"role": "user", "content": _Str("a str subclass")}]},
    {"messages": [{"role": "user", "content": "ok"}, ("a", "tuple")]},
    # Floats at the edges of what orjson writes as the standard library does (positional
    # notation), and past them: each body takes one way or the other, with the same bytes.
    {"temperature": 0.0, "neg": -0.0, "low": 1e-4, "high": 9999999999999998.0, "tiny": 5e-324},
    {"temperature": 0.7, "below": 9.999999999999999e-05},
    {"temperature": 0.7, "at": 1e16, "neg": -1e16},
    {"temperature": math.inf},
    {"temperature": -math.inf},
    {"extra": [0.1, 0.2 + 0.1, 1 / 3, 123456789.123, -2.5e-4]},
    {"temperature": _Float(0.5)},  # a float subclass
    {"messages": [{"role": "user", "content": "ok", "weight": 0.25}], "temperature": 0.7, "top_p": 0.95},
]


@pytest.mark.parametrize("body", _REQUEST_BODIES)
def test_a_request_body_is_written_as_the_standard_library_writes_it(body: Any) -> None:
    def standard(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")

    assert _outcome(encode_json, body) == _outcome(standard, body)


def _standard(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=1e-4, max_value=1e16, exclude_max=True))
def test_a_float_in_a_body_is_written_as_the_standard_library_writes_it(any_float: float, positional: float) -> None:
    for value in (any_float, positional, -positional):
        body: Any = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": value}
        assert _outcome(encode_json, body) == _outcome(_standard, body)


@pytest.mark.parametrize(
    ("value", "fast"),
    [(0.7, True), (0.0, True), (-0.0, True), (1e-4, True), (-1e15, True), (9.9e-5, False), (1e16, False)]
    + [(math.nan, False), (math.inf, False), (_Float(0.5), False)],
)
def test_a_body_holding_a_float_is_written_by_orjson_where_it_writes_the_same(value: float, fast: bool) -> None:
    # A temperature in the extra body no longer sends the whole request (a root call's
    # conversation with it) to the standard library's encoder.
    assert _plain({"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": value}) is fast
