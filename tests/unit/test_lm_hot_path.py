"""The sub-call path's cheaper forms give what the plain ones gave: request ids, request bodies,
log lines and the LM span while no tracer is installed."""

from __future__ import annotations

import json
import math
import os
import uuid
import warnings

import pytest
from opentelemetry import trace

from rlm_mcp.lm.http import encode_json
from rlm_mcp.lm.routing import request_id
from rlm_mcp.observability import tracing
from rlm_mcp.store.runs import encode_event


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
