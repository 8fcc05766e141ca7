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

Version rule: `version` is `RECORD_VERSION` of the writer (a record without it was written by
the first release: version 1). A new version only adds optional fields; a reader ignores fields it
does not know and reads a missing one as its default, so replicas of neighbouring versions read
each other's records. A field is never renamed or retyped (that would need a migration of the
stored records and is refused in review).

Notices (why a run waits, where it runs, why it was queued again) are structured (`Notice`:
a kind and its facts) and turned into a sentence only by `Notice.render()`; the stored `notice`
text is that rendering, kept for readers of the first release and for people.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from rlm_mcp.owners import LOCAL_OWNER, Owner
from rlm_mcp.usage import TokenCount, Usage

RECORD_VERSION = 2
"""The version of the record this code writes (1: the first release, which wrote no `version`)."""

# The one status vocabulary of a run, from accepted to ended. "queued": it waits for a free run
# slot; "running": it holds one; the others are how it ended, exactly one per run (the answer,
# or the limit, failure or cancellation that stopped it first).
RunStatus = Literal[
    "queued", "running", "completed", "max_iterations", "timeout", "budget_exceeded", "error", "cancelled"
]
FINAL_STATUSES: frozenset[str] = frozenset(
    {"completed", "max_iterations", "timeout", "budget_exceeded", "error", "cancelled"}
)


class RunPhase(StrEnum):
    """What a run is waiting on right now (shown in progress lines)."""

    QUEUED = "queued"  # for a free run slot
    STARTING = "starting"
    SANDBOX = "sandbox"  # for its sandbox to open
    LM = "lm"  # for the root model's reply
    CELL = "cell"  # for code to run
    DONE = "done"


@dataclass
class RunLimits:
    """Limits of one run tree (children inherit what is left of time and tokens)."""

    max_iterations: int
    max_depth: int
    timeout_s: float
    token_budget: int | None
    max_errors: int


class RunRequest(BaseModel):
    """What was asked: fixed from the moment the run is accepted."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    query: str
    context_ids: list[str]
    owner: Owner  # who may see, wait on and cancel the run (rlm_mcp.owners)
    limits: RunLimits
    model: str | None = None  # the root model the run was started with
    # Room for the features built on this record: the conversation a run belongs to, and the
    # W3C trace context (`traceparent`, `tracestate`) its spans continue.
    session_id: str | None = None
    trace_context: dict[str, str] | None = None


class RunResult(BaseModel):
    """What a run returns, whatever way it ended."""

    status: RunStatus
    answer: str | None
    reason: str | None
    run_id: str
    iterations: int
    usage: Usage
    duration_s: float
    sub_calls: int


class NotStarted(BaseModel):
    """Why a run never started (no slot, a context gone, the endpoint unreachable at the first
    call): a waiting `rlm_complete` raises it as a tool error."""

    cause: str
    fix: str | None = None


# -- notices --------------------------------------------------------------------------------------
class WorkerRef(BaseModel):
    """A team-mode worker, as a notice names it."""

    model_config = ConfigDict(frozen=True)

    worker_id: int | None = None
    host: str | None = None
    pid: int | None = None

    def render(self) -> str:
        if self.worker_id is None:
            return "an unknown worker"
        if self.host is None:
            return f"worker {self.worker_id}"
        return f"worker {self.worker_id} (host {self.host}, pid {self.pid})"


class NoticeKind(StrEnum):
    RUNNING_ON = "running_on"  # worker: it executes there
    REQUEUED_WORKER_LOST = "requeued_worker_lost"  # worker: lost before the first LM reply
    REQUEUED_WORKER_SHUTDOWN = "requeued_worker_shutdown"  # worker: shut down before the first LM reply
    NO_WORKER = "no_worker"  # wait_s: queued, and no live worker to take it
    WORKER_LOST = "worker_lost"  # worker, lease_s: ended, its worker stopped heartbeating
    SHUT_DOWN = "shut_down"  # worker (None: this server): cancelled by its server's shutdown
    REQUEUED_UNRECORDED = "requeued_unrecorded"  # worker: its first LM reply could not be recorded
    STOPPED_UNRECORDED = "stopped_unrecorded"  # worker: ended, its first LM reply could not be recorded
    RECORD_REFUSED = "record_refused"  # text: ended `error`, the store refused its final record (why)
    TEXT = "text"  # text: a sentence as a record of the first release wrote it


_UNRECORDED = "its first answered LM call could not be recorded (the database was unreachable)"

# How long a notice's free text may be (a first-release sentence; it rides in NOTIFY).
NOTICE_TEXT_MAX = 500


class Notice(BaseModel):
    """Why a run waits, where it runs, or why it went back to the queue: a kind and its facts,
    turned into a sentence by `render()` only."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: NoticeKind
    worker: WorkerRef | None = None
    wait_s: float | None = None
    lease_s: float | None = None
    text: str | None = Field(default=None, max_length=NOTICE_TEXT_MAX)

    def render(self) -> str:
        who = (self.worker or WorkerRef()).render()
        match self.kind:
            case NoticeKind.RUNNING_ON:
                return f"running on {who}"
            case NoticeKind.REQUEUED_WORKER_LOST:
                return f"{who} was lost before the run called the model; it was queued again"
            case NoticeKind.REQUEUED_WORKER_SHUTDOWN:
                return f"the {who} shut down before the run had an LM reply; it was queued again"
            case NoticeKind.NO_WORKER:
                wait = f"{self.wait_s:.0f} s" if self.wait_s is not None else "the queue timeout"
                return (
                    "queued, but no worker is alive to run it (start one: rlm-mcp serve --role worker or --role both); "
                    f"it ends with an error if none takes it within {wait} of queueing (RLM_MCP_RUN_QUEUE_TIMEOUT_S)"
                )
            case NoticeKind.WORKER_LOST:
                lease = f"{self.lease_s:.0f} s" if self.lease_s is not None else "its lease"
                return (
                    f"The run was executing on {who}, which stopped sending heartbeats for more than {lease} "
                    "(RLM_MCP_WORKER_LEASE_S) and is presumed lost, so the run was stopped. "
                    "Start it again with rlm_start."
                )
            case NoticeKind.SHUT_DOWN:
                if self.worker is None:
                    return "the server shut down"
                return f"the {who} running it shut down; start it again with rlm_start"
            case NoticeKind.REQUEUED_UNRECORDED:
                return f"{_UNRECORDED}; it was queued again"
            case NoticeKind.STOPPED_UNRECORDED:
                return f"The run was stopped on {who}: {_UNRECORDED}. Start it again with rlm_start."
            case NoticeKind.RECORD_REFUSED:
                return (
                    f"The store refused the run's final record ({self.text or 'no reason given'}), so the run "
                    "ended with an error and its answer was not kept. Start it again."
                )
            case NoticeKind.TEXT:
                return self.text or ""

    @classmethod
    def of_text(cls, text: str) -> Notice:
        """A sentence from a record that has no facts (the first release's)."""
        return cls(kind=NoticeKind.TEXT, text=text[:NOTICE_TEXT_MAX])


def render_notices(*notices: Notice | None) -> str | None:
    """The sentences of the notices given, in order, joined; None when there is none."""
    said = [n.render() for n in notices if n is not None]
    return "; ".join(said) if said else None


# -- the record -----------------------------------------------------------------------------------
class _State(BaseModel):
    """The live part of a record: what changes while the run executes."""

    model_config = ConfigDict(extra="ignore")

    status: RunStatus = "queued"
    phase: RunPhase | None = None
    iterations: int = 0
    max_iterations: int | None = None
    sub_calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    elapsed_s: float | None = None
    notice: Notice | None = None
    last_event: str | None = None  # the event that caused the latest change (team mode)

    def state_json(self) -> dict[str, Any]:
        """The live state as the stored record's keys hold it, in their order (the record and
        the live announcement both encode it here)."""
        notice = self.notice
        return {
            "status": self.status,
            "iterations": self.iterations,
            "max_iterations": self.max_iterations,
            "sub_calls": self.sub_calls,
            "usage": self.usage.to_dict(),
            "elapsed_s": self.elapsed_s,
            "notice": notice.render() if notice is not None else None,
            "notice_facts": notice.model_dump(mode="json", exclude_none=True) if notice is not None else None,
            "phase": str(self.phase) if self.phase is not None else None,
            "last_event": self.last_event,
        }


class LiveSummary(_State):
    """The part of a record a worker announces on each progress event (NOTIFY), applied by
    followers without reading the row. Its one encoding is `encode_live` / `decode_live`."""

    version: int = RECORD_VERSION


class RunRecord(_State):
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

    def live(self) -> LiveSummary:
        state = {name: getattr(self, name) for name in _State.model_fields}
        return LiveSummary.model_validate({**state, "usage": self.usage.copy_of()})

    def with_live(self, live: LiveSummary) -> RunRecord:
        """This record with `live`'s state (a follower applying an announcement)."""
        return self.model_copy(update={name: getattr(live, name) for name in _State.model_fields})

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

    # -- the stored JSON ----------------------------------------------------------------------
    def to_stored(self) -> dict[str, Any]:
        """The JSON object stored and served (`rlm://runs/{id}`): flat, in the first release's
        key order, with None fields left out."""
        r = self.request
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "query": r.query,
            "context_ids": list(r.context_ids),
            "owner": str(r.owner),
            "limits": asdict(r.limits),
            "created_at": self.created_at,
            "model": r.model,
            "session_id": r.session_id,
            "trace_context": r.trace_context,
            **self.state_json(),
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
        data = _state_fields(obj)
        result = _result_of(obj.get("result"))
        if result is not None and data["status"] not in FINAL_STATUSES:  # a record older than its status
            data["status"] = result.status
        data.update(
            version=_int(obj.get("version"), 1),
            run_id=obj["run_id"],
            created_at=_float(obj.get("created_at"), 0.0),
            request=_request_of(obj),
            result=result,
            not_started=_not_started_of(obj.get("not_started")),
        )
        return cls.model_validate(data)


def summed_usage(records: Iterable[RunRecord]) -> Usage:
    """The usage of several runs together (a kept session's), by model and in total, with the
    cost where the price table priced each call (`TokenCount.cost_usd`)."""
    total = Usage()
    for record in records:
        total.merge(record.spent)
    return total


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(value: object, default: float) -> float:
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


def _state_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The live state of a stored record or an announcement, tolerant of old and odd values."""
    status = obj.get("status")
    phase = obj.get("phase")
    max_iterations = obj.get("max_iterations")
    elapsed = obj.get("elapsed_s")
    last_event = obj.get("last_event")
    return {
        "status": status if isinstance(status, str) and status in _STATUSES else "queued",
        "phase": RunPhase(phase) if isinstance(phase, str) and phase in _PHASES else None,
        "iterations": _int(obj.get("iterations"), 0),
        "max_iterations": _int(max_iterations, 0) if max_iterations is not None else None,
        "sub_calls": _int(obj.get("sub_calls"), 0),
        "usage": Usage.of(obj.get("usage")),
        "elapsed_s": _float(elapsed, 0.0) if elapsed is not None else None,
        "notice": _notice_of(obj),
        "last_event": last_event if isinstance(last_event, str) else None,
    }


_STATUSES = frozenset(RunStatus.__args__)  # type: ignore[attr-defined]
_PHASES = frozenset(p.value for p in RunPhase)


def _request_of(obj: dict[str, Any]) -> RunRequest:
    limits = obj.get("limits")
    if isinstance(limits, dict):
        try:
            run_limits = RunLimits(**{f: limits[f] for f in RunLimits.__dataclass_fields__})
        except KeyError:
            run_limits = _no_limits(obj)
    else:  # a record older than its limits
        run_limits = _no_limits(obj)
    owner, query, model, session = obj.get("owner"), obj.get("query"), obj.get("model"), obj.get("session_id")
    trace = obj.get("trace_context")
    return RunRequest(
        query=query if isinstance(query, str) else "",
        context_ids=[c for c in obj.get("context_ids") or [] if isinstance(c, str)],
        owner=Owner(owner) if isinstance(owner, str) else LOCAL_OWNER,
        limits=run_limits,
        model=model if isinstance(model, str) else None,
        session_id=session if isinstance(session, str) else None,
        trace_context=trace if isinstance(trace, dict) else None,
    )


def _no_limits(obj: dict[str, Any]) -> RunLimits:
    return RunLimits(
        max_iterations=_int(obj.get("max_iterations"), 0), max_depth=0, timeout_s=0.0, token_budget=None, max_errors=0
    )


def _result_of(data: object) -> RunResult | None:
    if not isinstance(data, dict):
        return None
    return RunResult.model_validate({**data, "usage": Usage.of(data.get("usage"))})


def _not_started_of(data: object) -> NotStarted | None:
    if not isinstance(data, dict) or not isinstance(data.get("cause"), str):
        return None
    fix = data.get("fix")
    return NotStarted(cause=data["cause"], fix=fix if isinstance(fix, str) else None)


# -- the live summary's one encoding --------------------------------------------------------------
LIVE_MAX_BYTES = 4000
"""The most bytes an announcement's payload takes (PostgreSQL refuses a NOTIFY payload of 8000
bytes or more; the channel name and the run id fit in what is left)."""


def encode_live(run_id: str, live: LiveSummary) -> str:
    """The NOTIFY payload that announces `live`: the run id, a space, then the summary as JSON
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
        return run_id, LiveSummary.model_validate({**_state_fields(obj), "version": _int(obj.get("version"), 1)})
    except pydantic.ValidationError:
        return run_id, None


def _live_json(live: LiveSummary) -> dict[str, Any]:
    data = {**live.state_json(), "version": live.version}
    return {k: v for k, v in data.items() if v is not None}


__all__ = [
    "FINAL_STATUSES",
    "LIVE_MAX_BYTES",
    "RECORD_VERSION",
    "LiveSummary",
    "NotStarted",
    "Notice",
    "NoticeKind",
    "RunLimits",
    "RunPhase",
    "RunRecord",
    "RunRequest",
    "RunResult",
    "RunStatus",
    "TokenCount",
    "Usage",
    "WorkerRef",
    "decode_live",
    "encode_live",
    "render_notices",
    "summed_usage",
]
