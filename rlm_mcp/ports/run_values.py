"""The run contract's values: a run's statuses, limits, request, result, notices and live state.

`ports.runs` is the contract's front door (the record, the run-end hook, the requeue rule and
the run-id source, and every name here); `ports.run_codecs` is the one JSON form of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rlm_mcp.owners import Owner
from rlm_mcp.usage import Usage

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
    # Where the run's end is delivered (a webhook), checked against the owner's allow-list.
    webhook_url: str | None = None


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


# -- the live state ------------------------------------------------------------------------------
class LiveState(BaseModel):
    """A run's live state: what changes while it executes. The one vocabulary of a run's live
    counters: the record holds it, a worker announces it (`LiveSummary`), the engine's
    `RunProgress` is its mutable form (`RunProgress.live` / `RunProgress.apply`), and the
    service's read views (`RunSnapshot`) are derived from it."""

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


class LiveSummary(LiveState):
    """The part of a record a worker announces on each progress event (NOTIFY), applied by
    followers without reading the row. Its one encoding is `encode_live` / `decode_live`."""

    version: int = RECORD_VERSION
