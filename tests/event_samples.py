"""Event fields the event tests build on: one `llm_call`'s required fields, so the line tests
and the fast-path tests check the same event."""

from __future__ import annotations

from typing import Any

LLM_CALL_FIELDS: dict[str, Any] = {
    "run_id": "r1",
    "role": "sub",
    "model": "m",
    "prompt_tokens": 3,
    "completion_tokens": 4,
    "latency_s": 0.25,
    "status": "ok",
    "finish_reason": "stop",
    "error": None,
    "depth": 1,
}
