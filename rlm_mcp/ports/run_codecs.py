"""The run contract's one JSON form: the stored record's keys, read tolerantly, and the live
summary's NOTIFY payload.

Every decoder here accepts records of any version (the first release's included) and odd
values (a wrong type reads as the field's default); every encoder writes the current version's
keys in the first release's order, so `rlm://runs/{id}`, the viewer API and the stored records
keep their bytes. `RunRecord.to_stored` / `RunRecord.from_stored` (`ports.runs`) are built from
these pieces.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pydantic

from rlm_mcp.owners import LOCAL_OWNER, Owner
from rlm_mcp.ports.run_values import (
    RECORD_VERSION,
    LiveState,
    LiveSummary,
    Notice,
    NotStarted,
    RunLimits,
    RunPhase,
    RunRequest,
    RunResult,
    RunStatus,
)
from rlm_mcp.usage import Usage


def state_json(state: LiveState) -> dict[str, Any]:
    """The live state as the stored record's keys hold it, in their order (the record and the
    live announcement both encode it here)."""
    notice = state.notice
    return {
        "status": state.status,
        "iterations": state.iterations,
        "max_iterations": state.max_iterations,
        "sub_calls": state.sub_calls,
        "usage": state.usage.to_dict(),
        "elapsed_s": state.elapsed_s,
        "notice": notice.render() if notice is not None else None,
        "notice_facts": notice.model_dump(mode="json", exclude_none=True) if notice is not None else None,
        "phase": str(state.phase) if state.phase is not None else None,
        "last_event": state.last_event,
    }


_LIMIT_FIELDS = tuple(f.name for f in fields(RunLimits))


def request_json(request: RunRequest) -> dict[str, Any]:
    """The request's keys of the stored record, in the first release's order."""
    return {
        "query": request.query,
        "context_ids": list(request.context_ids),
        "owner": str(request.owner),
        # Its fields are numbers or None: a shallow dict is `asdict`'s result without its
        # recursive deep copy (a team worker encodes the record at every live summary).
        "limits": {name: getattr(request.limits, name) for name in _LIMIT_FIELDS},
    }


def int_of(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def float_of(value: object, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _notice_of(obj: dict[str, Any]) -> Notice | None:
    facts = obj.get("notice_facts")
    if isinstance(facts, dict):
        try:
            return Notice.model_validate(facts)
        except pydantic.ValidationError:  # a kind of a newer version: its sentence below
            pass
    text = obj.get("notice")
    return Notice.of_text(text) if isinstance(text, str) and text else None


def state_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The live state of a stored record or an announcement, tolerant of old and odd values."""
    status = obj.get("status")
    phase = obj.get("phase")
    max_iterations = obj.get("max_iterations")
    elapsed = obj.get("elapsed_s")
    last_event = obj.get("last_event")
    return {
        "status": status if isinstance(status, str) and status in _STATUSES else "queued",
        "phase": RunPhase(phase) if isinstance(phase, str) and phase in _PHASES else None,
        "iterations": int_of(obj.get("iterations"), 0),
        "max_iterations": int_of(max_iterations, 0) if max_iterations is not None else None,
        "sub_calls": int_of(obj.get("sub_calls"), 0),
        "usage": Usage.of(obj.get("usage")),
        "elapsed_s": float_of(elapsed, 0.0) if elapsed is not None else None,
        "notice": _notice_of(obj),
        "last_event": last_event if isinstance(last_event, str) else None,
    }


_STATUSES = frozenset(RunStatus.__args__)  # type: ignore[attr-defined]
_PHASES = frozenset(p.value for p in RunPhase)


def request_of(obj: dict[str, Any]) -> RunRequest:
    """The request a stored record carries (a record older than its limits gets none)."""
    limits = obj.get("limits")
    if isinstance(limits, dict):
        try:
            run_limits = RunLimits(**{f: limits[f] for f in RunLimits.__dataclass_fields__})
        except KeyError:
            run_limits = _no_limits(obj)
    else:  # a record older than its limits
        run_limits = _no_limits(obj)
    owner, query, model, session = obj.get("owner"), obj.get("query"), obj.get("model"), obj.get("session_id")
    trace, webhook = obj.get("trace_context"), obj.get("webhook_url")
    return RunRequest(
        query=query if isinstance(query, str) else "",
        context_ids=[c for c in obj.get("context_ids") or [] if isinstance(c, str)],
        owner=Owner(owner) if isinstance(owner, str) else LOCAL_OWNER,
        limits=run_limits,
        model=model if isinstance(model, str) else None,
        session_id=session if isinstance(session, str) else None,
        trace_context=trace if isinstance(trace, dict) else None,
        webhook_url=webhook if isinstance(webhook, str) else None,
    )


def _no_limits(obj: dict[str, Any]) -> RunLimits:
    return RunLimits(
        max_iterations=int_of(obj.get("max_iterations"), 0), max_depth=0, timeout_s=0.0, token_budget=None, max_errors=0
    )


def result_of(data: object) -> RunResult | None:
    if not isinstance(data, dict):
        return None
    return RunResult.model_validate({**data, "usage": Usage.of(data.get("usage"))})


def not_started_of(data: object) -> NotStarted | None:
    if not isinstance(data, dict) or not isinstance(data.get("cause"), str):
        return None
    fix = data.get("fix")
    return NotStarted(cause=data["cause"], fix=fix if isinstance(fix, str) else None)


# -- the live summary's one encoding --------------------------------------------------------------
LIVE_MAX_BYTES = 4000
"""The most bytes an announcement's payload takes (PostgreSQL refuses a NOTIFY payload of 8000
bytes or more; the channel name and the run id fit in what is left)."""


def encode_live(run_id: str, live: LiveState) -> str:
    """The NOTIFY payload that announces `live` (a live summary, or a record: its live summary is
    the same JSON, so a worker encodes its record without building one): the run id, a space,
    then the summary as JSON
    (the keys of the stored record, so a follower of the first release applies it too). Never
    longer than `LIVE_MAX_BYTES`: the per-model usage is left out when it would not fit, and the
    run id alone is sent if even that does not (the follower then reads the row)."""
    data = _live_json(live)
    payload = f"{run_id} {json.dumps(data, ensure_ascii=False)}"
    if len(payload.encode()) > LIVE_MAX_BYTES:
        data["usage"] = {"total": data["usage"]["total"], "by_model": {}}
        payload = f"{run_id} {json.dumps(data, ensure_ascii=False)}"
    return payload if len(payload.encode()) <= LIVE_MAX_BYTES else run_id


def decode_live(payload: str) -> tuple[str, LiveSummary | None]:
    """The run id and the live summary of an announcement (None: the payload carries the run id
    alone or an unreadable summary; read the row). Reads the first release's payloads (its
    whole summary) too."""
    run_id, _, rest = payload.partition(" ")
    if not rest:
        return run_id, None
    try:
        obj = json.loads(rest)
    except ValueError:
        return run_id, None
    if not isinstance(obj, dict):
        return run_id, None
    try:
        return run_id, LiveSummary.model_validate({**state_fields(obj), "version": int_of(obj.get("version"), 1)})
    except pydantic.ValidationError:
        return run_id, None


def _live_json(live: LiveState) -> dict[str, Any]:
    # A record's own `version` may be an older writer's; an announcement is this version's.
    data = {**state_json(live), "version": live.version if isinstance(live, LiveSummary) else RECORD_VERSION}
    return {k: v for k, v in data.items() if v is not None}


__all__ = [
    "LIVE_MAX_BYTES",
    "decode_live",
    "encode_live",
    "float_of",
    "int_of",
    "not_started_of",
    "request_json",
    "request_of",
    "result_of",
    "state_fields",
    "state_json",
]
