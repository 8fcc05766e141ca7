"""The hot path's shortcuts read and write exactly what the general code does: `to_json` of a
flat event (no pydantic dump) and a call's usage accounted without a validated model per call."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rlm_mcp.events import LLMCall, LogTruncated, TurnStart, loads, to_json
from rlm_mcp.ports.chat import CallRecord
from rlm_mcp.store.event_lines import encode_event
from rlm_mcp.usage import TokenCount, Usage
from tests.event_samples import LLM_CALL_FIELDS


def _dumped(event: Any, ts: float | None = None) -> dict[str, Any]:
    """The general path: pydantic's JSON-mode dump, stamped, optional Nones left out."""
    data = event.model_dump(mode="json")
    if ts is not None:
        data["ts"] = ts
    return {k: v for k, v in data.items() if not (v is None and k in event.OMIT_WHEN_NONE)}


@pytest.mark.parametrize(
    "event",
    [
        LLMCall(**LLM_CALL_FIELDS),
        LLMCall(
            **LLM_CALL_FIELDS,
            iteration=2,
            block=0,
            batch=1,
            index=7,
            prompt="é q",
            prompt_chars=3,
            queued_s=2,
            retries=1,
        ),
        LLMCall(**{**LLM_CALL_FIELDS, "latency_s": float("inf")}, cost_usd=float("nan")),  # JSON mode: null
        LLMCall(**LLM_CALL_FIELDS, newer_field={"kept": [1, 2]}),  # a newer version's field, after the known ones
        TurnStart(run_id="r", iteration=1, max_iterations=5, depth=0),
        LogTruncated(max_bytes=10),
    ],
)
@pytest.mark.parametrize("ts", [None, 1780000000.5])
def test_to_json_of_a_flat_event_is_the_dump(event: Any, ts: float | None) -> None:
    got = to_json(event, ts=ts)
    assert list(got.items()) == list(_dumped(event, ts).items())  # key order included
    assert encode_event(got, 1 << 20) == encode_event(_dumped(event, ts), 1 << 20)


def test_a_flat_event_reads_back_to_the_same_line() -> None:
    line = encode_event(to_json(LLMCall(**LLM_CALL_FIELDS, batch=2, index=0, answer="a"), ts=5), 1 << 20)
    assert encode_event(to_json(loads(line)), 1 << 20) == line


def test_a_call_is_accounted_as_add_counts_it() -> None:
    plain = CallRecord("m", 12, 7, 0.01, "ok", "sub", estimated=False, queued_s=0.0)
    priced = CallRecord(
        "m", 5, 1, 0.01, "ok", "sub", estimated=False, queued_s=0.0, cached_prompt_tokens=3, cost_usd=0.25
    )
    by_call, by_add = Usage(), Usage()
    for record in (plain, priced, plain, replace(plain, model="n")):
        by_call.add_call(record)
        by_add.add(
            record.model,
            record.prompt_tokens,
            record.completion_tokens,
            cached_prompt_tokens=record.cached_prompt_tokens,
            cost_usd=record.cost_usd,
        )
    assert by_call.model_dump_json() == by_add.model_dump_json()
    assert by_call.total.calls == 4 and by_call.by_model["n"].calls == 1


def test_absorbing_sets_what_setting_the_fields_sets() -> None:
    # `absorb` writes the model's fields directly: the values, the fields set (what
    # `exclude_unset` and `copy_of` read) and the JSON must be what attribute sets give.
    for cost in (None, 0.5):
        record = CallRecord("m", 5, 2, 0.01, "ok", "sub", cached_prompt_tokens=1, cost_usd=cost)
        absorbed, assigned = TokenCount(), TokenCount()
        absorbed.absorb(record)
        absorbed.absorb(TokenCount(prompt_tokens=1, calls=2))
        for counts in (record, TokenCount(prompt_tokens=1, calls=2)):
            assigned.prompt_tokens += counts.prompt_tokens
            assigned.completion_tokens += counts.completion_tokens
            assigned.calls += counts.calls if isinstance(counts, TokenCount) else 1
            assigned.cached_prompt_tokens += counts.cached_prompt_tokens
            if counts.cost_usd is not None:
                assigned.cost_usd = (assigned.cost_usd or 0.0) + counts.cost_usd
        assert absorbed == assigned and absorbed.model_fields_set == assigned.model_fields_set
        assert absorbed.model_dump(exclude_unset=True) == assigned.model_dump(exclude_unset=True)
        assert absorbed.model_dump_json() == assigned.model_dump_json()
