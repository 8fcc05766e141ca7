"""An LM call's `llm_call` event as its log line, built and encoded without the event's model.

Every root call and sub-call has an `llm_call` event (`events.LLMCall`), 16 to 200 of them per
sub-call batch. What the run log keeps of one is a line of JSON, and building the pydantic model
only to read its fields back into that line cost about as much as the call's other bookkeeping.
`call_line` takes the event's values (all computed by the engine, already of their field's
type: mypy checks them here as the model would) and keeps them as the JSON object the model's
line holds, in its field order, the optional fields left out as the model leaves them out;
`CallLine.line` encodes it with `ts`, the same bytes `store.runs.event_line` writes of the model
(tests/unit/test_call_lines.py compares the two over the variants: failed, throttled and retried
calls, priced ones, root and sub calls, odd strings). Where a reader needs the object (a log that
keeps events as objects, a test's sink) `CallLine.event()` builds the model from the same values.

Like `events`, it imports only the standard library, orjson and `events`, so every layer may use it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from rlm_mcp.events import CallRole, LLMCall

__all__ = ["CallLine", "call_line"]


class CallLine:
    """One `llm_call` event as the JSON object its log line holds (without `ts`, which the log
    stamps as it writes): `fields`, in `LLMCall`'s field order, None-valued optional fields left out."""

    __slots__ = ("fields",)
    type: ClassVar[str] = "llm_call"

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    @property
    def answered(self) -> bool:
        """Whether the call was answered (its event has no error)."""
        return self.fields["error"] is None

    def event(self) -> LLMCall:
        """The event as its model (for readers that need the object): the same event the line holds."""
        return LLMCall(**self.fields)

    def line(self, ts: float) -> bytes | None:
        """The log line's bytes stamped with `ts` (no newline): what `events.flat_line` writes of
        `self.event()`, or None where that is not the bytes the standard library writes (a float
        orjson writes otherwise, NaN or infinite, a lone surrogate, a string holding the
        separators: see `flat_line`), and the caller encodes the model (`store.runs.event_line`)."""
        data = self.fields
        for value in (data["latency_s"], data.get("cost_usd"), data.get("queued_s"), data.get("backoff_s"), ts):
            if type(value) is float and not (value == 0.0 or 1e-4 <= abs(value) < 1e16):
                return None
        try:
            compact = orjson.dumps({**data, "ts": ts})
        except orjson.JSONEncodeError:  # a lone surrogate
            return None
        top = len(data) + 1
        if compact.count(b'":') != top or compact.count(b',"') != top - 1:
            return None  # a string holds a separator: left to the standard library
        return compact.replace(b'":', b'": ').replace(b',"', b', "')


def call_line(
    *,
    run_id: str,
    role: CallRole,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    latency_s: float,
    finish_reason: str | None,
    error: str | None,
    depth: int,
    iteration: int | None = None,
    block: int | None = None,
    batch: int | None = None,
    index: int | None = None,
    prompt: str | None = None,
    prompt_chars: int | None = None,
    answer: str | None = None,
    answer_chars: int | None = None,
    cost_usd: float | None = None,
    queued_s: float | None = None,
    retries: int | None = None,
    throttled: int | None = None,
    backoff_s: float | None = None,
) -> CallLine:
    """The `llm_call` event of these values (`LLMCall`'s fields but `type`, `status`, which the
    error decides, and `ts`), as its line's object."""
    fields: dict[str, Any] = {
        "type": "llm_call",
        "run_id": run_id,
        "role": role,
        "model": model,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "latency_s": latency_s,
        "status": "ok" if error is None else "error",
        "finish_reason": finish_reason,
        "error": error,
        "depth": depth,
    }
    # The optional fields, in their order, each only when set (as `LLMCall.OMIT_WHEN_NONE` leaves them out).
    if iteration is not None:
        fields["iteration"] = iteration
    if block is not None:
        fields["block"] = block
    if batch is not None:
        fields["batch"] = batch
    if index is not None:
        fields["index"] = index
    if prompt is not None:
        fields["prompt"] = prompt
    if prompt_chars is not None:
        fields["prompt_chars"] = prompt_chars
    if answer is not None:
        fields["answer"] = answer
    if answer_chars is not None:
        fields["answer_chars"] = answer_chars
    if cost_usd is not None:
        fields["cost_usd"] = float(cost_usd)  # as the model's `float` field keeps it
    if queued_s is not None:
        fields["queued_s"] = queued_s
    if retries is not None:
        fields["retries"] = retries
    if throttled is not None:
        fields["throttled"] = throttled
    if backoff_s is not None:
        fields["backoff_s"] = backoff_s
    return CallLine(fields)
