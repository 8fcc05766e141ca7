"""The run log's lines: one JSON object per event, bounded in size (`store/runs.py` and the
PostgreSQL log, `store/pg/run_log.py`, write them)."""

from __future__ import annotations

import json
import time
from typing import Any

from rlm_mcp.call_lines import CallLine
from rlm_mcp.events import RunEvent, flat_line, to_json

__all__ = ["call_event_line", "encode_event", "event_line"]

_MARK = "…[truncated {n} chars]"


def _cut_strings(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + _MARK.format(n=len(value) - limit)
    if isinstance(value, dict):
        return {k: _cut_strings(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cut_strings(v, limit) for v in value]
    return value


# What `json.dumps(event, ensure_ascii=False, default=str)` builds on every call; it keeps no state.
_EVENT_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)


def encode_event(event: dict[str, Any], max_bytes: int) -> bytes:
    """One JSONL line of at most max_bytes from an event's JSON object (`events.to_json`; non-JSON
    values become strings). Cutting strings keeps the event readable as its type; the last
    resort, `{type, ts, truncated}`, reads back as an `events.EventStub`."""
    data = _EVENT_ENCODER.encode(event).encode()  # encoded once: its length is checked, then written
    limit = max_bytes // 2
    while len(data) + 1 > max_bytes and limit >= 64:
        data = _EVENT_ENCODER.encode(_cut_strings(event, limit)).encode()
        limit //= 2
    if len(data) + 1 > max_bytes:
        # Too many small fields to cut: keep only what identifies the event.
        data = json.dumps({"type": event.get("type"), "ts": event.get("ts"), "truncated": True}, default=str).encode()
    return data + b"\n"


def event_line(event: RunEvent, max_bytes: int) -> bytes:
    """The log line of `event`, stamped with the time now: `encode_event(to_json(event, ts=now),
    max_bytes)`, byte for byte, written by `events.flat_line` when it can (a flat event within
    the cap: every sub-call's `llm_call`)."""
    ts = time.time()
    data = flat_line(event, ts=ts)
    if data is not None and len(data) < max_bytes:
        return data + b"\n"
    return encode_event(to_json(event, ts=ts), max_bytes)


def call_event_line(call: CallLine, max_bytes: int) -> bytes:
    """The log line of an LM call's event, stamped with the time now: `event_line(call.event(),
    max_bytes)`, byte for byte, written from the call's values without the model when it can
    (every call whose line is within the cap and whose values orjson writes as the standard
    library does: see `CallLine.line`)."""
    ts = time.time()
    data = call.line(ts)
    if data is not None and len(data) < max_bytes:
        return data + b"\n"
    return encode_event(to_json(call.event(), ts=ts), max_bytes)
