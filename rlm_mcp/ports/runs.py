"""The run contract: a run's request, state and result as one typed, versioned record.

A run's state crosses processes (a front and a worker in team mode), lives in a database
column (`rlm_runs.summary`) or a file (`runs/<id>/summary.json`), rides in a NOTIFY and is served
as `rlm://runs/{id}`. Everywhere it is a `RunRecord`; the JSON form exists only at the edges:

- `RunRecord.to_stored()` / `RunRecord.from_stored(obj)`: the stored (and served) JSON object.
  It keeps the flat keys the first release wrote (`run_id`, `query`, `context_ids`, `owner`,
  `limits`, `created_at`, `model`, `status`, `iterations`, `max_iterations`, `sub_calls`,
  `usage`, `elapsed_s`, `notice`, `result`, `not_started`, ...), so those records still read
  and `rlm://runs/{id}` keeps its keys; it adds `version` and `notice_facts`.
- `LiveSummary` with `encode_live` / `decode_live`: the small part of a record that a worker
  announces on each progress event (NOTIFY payloads are capped at 8000 bytes by PostgreSQL; this
  one never exceeds `LIVE_MAX_BYTES`).
- `encode_final` / `decode_announcement`: a run's end announced with its final record's stored
  JSON when it fits (`FINAL_MAX_BYTES`), so a follower reads no row at the end.

Version rule: `version` is `RECORD_VERSION` of the writer (a record without it was written by
the first release: version 1). A new version only adds optional fields; a reader ignores fields it
does not know and reads a missing one as its default, so replicas of neighbouring versions read
each other's records. A field is never renamed or retyped (that would need a migration of the
stored records and is refused in review).

The contract is three modules: `ports.run_values` (statuses, request, result, notices, the live
state), `ports.run_codecs` (their one JSON form) and this one (the record, the run-end hook, the
requeue rule, the run-id source); every name is importable from here.

Notices (why a run waits, where it runs, why it was queued again) are structured (`Notice`:
a kind and its facts) and turned into a sentence only by `Notice.render()`; the stored `notice`
text is that rendering, kept for readers of the first release and for people.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from rlm_mcp.owners import Owner
from rlm_mcp.ports.run_codecs import (
    LIVE_MAX_BYTES,
    decode_live,
    encode_live,
    float_of,
    int_of,
    not_started_of,
    request_json,
    request_of,
    result_of,
    state_fields,
    state_json,
)
from rlm_mcp.ports.run_values import (
    FINAL_STATUSES,
    NOTICE_TEXT_MAX,
    RECORD_VERSION,
    LiveState,
    LiveSummary,
    Notice,
    NoticeKind,
    NotStarted,
    RunLimits,
    RunPhase,
    RunRequest,
    RunResult,
    RunStatus,
    WorkerRef,
    render_notices,
)
from rlm_mcp.usage import TokenCount, Usage


def new_run_id() -> str:
    """A new run's id: the one source (the local run manager and the team front both mint here)."""
    return f"run_{uuid.uuid4().hex[:20]}"


def may_requeue(*, lm_called: bool, requeues: int) -> bool:
    """Whether a run that lost its executor (its worker lost, shut down, or unable to record its
    first LM reply) goes back to the queue instead of ending: only when no LM reply was recorded
    (nothing was spent, so starting it again from scratch repeats nothing) and it was never
    queued again before (once, so a run that keeps killing its workers ends)."""
    return not lm_called and requeues == 0


class RunRecord(LiveState):
    """A run: its request, its live state and, once it ended, its result."""

    version: int = RECORD_VERSION
    run_id: str
    created_at: float
    request: RunRequest
    result: RunResult | None = None
    not_started: NotStarted | None = None

    @property
    def done(self) -> bool:
        """Whether the run has ended (its result is recorded)."""
        return self.result is not None

    @property
    def spent(self) -> Usage:
        """What the run used: its result's usage once it ended, the live count before."""
        return self.result.usage if self.result is not None else self.usage

    @classmethod
    def of_live(
        cls,
        live: LiveState,
        *,
        run_id: str,
        created_at: float,
        request: RunRequest,
        result: RunResult | None = None,
        not_started: NotStarted | None = None,
    ) -> RunRecord:
        """A run's record from its live state (an executing or followed run's)."""
        return cls.model_validate(
            {
                **live_fields(live),
                "run_id": run_id,
                "created_at": created_at,
                "request": request,
                "result": result,
                "not_started": not_started,
            }
        )

    def live(self) -> LiveSummary:
        return LiveSummary.model_validate({**live_fields(self), "usage": self.usage.copy_of()})

    def with_live(self, live: LiveState) -> RunRecord:
        """This record with `live`'s state (a follower applying an announcement)."""
        return self.model_copy(update=live_fields(live))

    def ended(
        self, status: RunStatus, reason: str, *, duration_s: float | None = None, notice: Notice | None = None
    ) -> RunRecord:
        """This record, ended without an answer (cancelled while queued, its worker lost, no
        worker in time): the result is made from the record's own counts."""
        result = RunResult(
            status=status,
            answer=None,
            reason=reason,
            run_id=self.run_id,
            iterations=self.iterations,
            usage=self.usage.copy_of(),
            duration_s=round(duration_s if duration_s is not None else (self.elapsed_s or 0.0), 3),
            sub_calls=self.sub_calls,
        )
        return self.model_copy(
            update={
                "status": status,
                "phase": RunPhase.DONE,
                "result": result,
                "notice": notice if notice is not None else Notice.of_text(reason),
            }
        )

    # -- the stored JSON (`ports.run_codecs`) -------------------------------------------------
    def to_stored(self) -> dict[str, Any]:
        """The JSON object stored and served (`rlm://runs/{id}`): flat, in the first release's
        key order, with None fields left out."""
        return {**self.stored_head(), **self.stored_tail()}

    def stored_head(self) -> dict[str, Any]:
        """The first keys of `to_stored`: the run id, its request and its creation, which never
        change while the run executes (a team worker encodes them once per run, not at each
        live summary it publishes)."""
        r = self.request
        data: dict[str, Any] = {
            "run_id": self.run_id,
            **request_json(r),
            "created_at": self.created_at,
            "model": r.model,
            "session_id": r.session_id,
            "trace_context": r.trace_context,
            "webhook_url": r.webhook_url,
        }
        return {k: v for k, v in data.items() if v is not None}

    def stored_tail(self) -> dict[str, Any]:
        """The keys of `to_stored` after `stored_head`'s: the state, the result, the version."""
        data: dict[str, Any] = {
            **state_json(self),
            "result": self.result.model_dump(mode="json") if self.result is not None else None,
            "not_started": self.not_started.model_dump() if self.not_started is not None else None,
            "version": RECORD_VERSION,  # the writer's: a record is written in this version's shape
        }
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_stored(cls, obj: object) -> RunRecord:
        """A stored record of any version (the first release's included); raises `ValueError`
        when `obj` is not a run record at all."""
        if not isinstance(obj, dict) or not isinstance(obj.get("run_id"), str):
            raise ValueError("not a run record: no run_id")
        data = state_fields(obj)
        result = result_of(obj.get("result"))
        if result is not None and data["status"] not in FINAL_STATUSES:  # a record older than its status
            data["status"] = result.status
        data.update(
            version=int_of(obj.get("version"), 1),
            run_id=obj["run_id"],
            created_at=float_of(obj.get("created_at"), 0.0),
            request=request_of(obj),
            result=result,
            not_started=not_started_of(obj.get("not_started")),
        )
        return cls.model_validate(data)


def live_fields(state: LiveState) -> dict[str, Any]:
    """The live state's fields of `state` (a record, an announcement, a live state), by name."""
    return {name: getattr(state, name) for name in LiveState.model_fields}


def summed_usage(records: Iterable[RunRecord]) -> Usage:
    """The usage of several runs together (a kept session's), by model and in total, with the
    cost where the price table priced each call (`TokenCount.cost_usd`)."""
    total = Usage()
    for record in records:
        total.merge(record.spent)
    return total


# -- a run's end, announced with its final record ------------------------------------------------
# The payload is the run id, a space, this word, then the record's stored JSON. A reader of an
# earlier version finds no JSON object after the id (`decode_live`), so to it the payload says
# "read the row", as the run id alone did: it still sees the end, one statement later.
FINAL_MARK = "final "
FINAL_MAX_BYTES = 7900  # PostgreSQL refuses a payload of 8000 bytes or more: the id alone then


def encode_final(run_id: str, stored: str) -> str:
    """The announcement of a run's end with its final record (`stored`: its `to_stored()` JSON
    text, as the row holds it); the run id alone when that would not fit in a payload."""
    payload = f"{run_id} {FINAL_MARK}{stored}"
    return payload if len(payload.encode()) <= FINAL_MAX_BYTES else run_id


def decode_announcement(payload: str) -> tuple[str, LiveSummary | RunRecord | None]:
    """The run id and what its announcement carries: a live summary, the final record, or None
    (the id alone, or nothing readable: read the row)."""
    run_id, _, rest = payload.partition(" ")
    if not rest.startswith(FINAL_MARK):
        return decode_live(payload)
    try:
        record = RunRecord.from_stored(json.loads(rest[len(FINAL_MARK) :]))
    except ValueError:  # not JSON, not a record (pydantic's errors are ValueErrors too)
        return run_id, None
    return run_id, (record if record.done and record.run_id == run_id else None)


# -- the run-end hook -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RunEnded:
    """A run's end, as the run-end hook is told it: once per run, after its final record is
    written (whoever wrote it: the local run manager, a team worker, a front cancelling a queued
    run, a sweeper ending a lost worker's run or one no worker took)."""

    run_id: str
    owner: Owner
    status: RunStatus
    session_id: str | None
    record: RunRecord

    @classmethod
    def of(cls, record: RunRecord) -> RunEnded:
        """The end of the run whose final record is `record`."""
        return cls(
            run_id=record.run_id,
            owner=record.request.owner,
            status=record.status,
            session_id=record.request.session_id,
            record=record,
        )


class RunEndHook(Protocol):
    """Work hung on every run's end (a kept session told its run is over, a webhook, a task's
    final state). Called once per run end, after the final record is written, shielded from
    cancellation; what it raises is logged and never changes the run's end."""

    async def __call__(self, ended: RunEnded, /) -> None: ...


__all__ = [
    "FINAL_STATUSES",
    "FINAL_MARK",
    "FINAL_MAX_BYTES",
    "LIVE_MAX_BYTES",
    "NOTICE_TEXT_MAX",
    "RECORD_VERSION",
    "LiveState",
    "LiveSummary",
    "NotStarted",
    "Notice",
    "NoticeKind",
    "RunEndHook",
    "RunEnded",
    "RunLimits",
    "RunPhase",
    "RunRecord",
    "RunRequest",
    "RunResult",
    "RunStatus",
    "TokenCount",
    "Usage",
    "WorkerRef",
    "decode_announcement",
    "decode_live",
    "encode_final",
    "encode_live",
    "live_fields",
    "may_requeue",
    "new_run_id",
    "render_notices",
    "summed_usage",
]
