"""The run queue's port: every operation on a team-mode run's state and its workers' state.

Two implementations keep the same rules: `store.pg.queue.PgRunQueue` (team mode: every
statement on `rlm_runs`' state and on `rlm_workers`, in `store/pg/`) and
`testing.memory_queue.MemoryRunQueue` (the fast tier's, with a clock the test moves). The front,
the worker and the sweeper (`service/queue/`) use only this. A run's states (`RunState`):

    queued --claim (attempt + 1, worker, claimed_at)--> running --finish--> done
      ^                                                   |
      +-- requeue (the worker hands it back, or its worker was lost before any answered LM
          call; once) ------------------------------------+
    queued --cancel, queue timeout--> done

Every write a worker makes for a run names the attempt it claimed (`attempt`): one that matches
nothing means the run is no longer this worker's (ended elsewhere, or claimed again after this
worker was declared lost), and the worker stops it at once. The worker's run log
(`FencedRunLog`) is fenced the same way.

Wake-ups: `listen_runs` delivers each run's announcements (a run id, or a run id and its live
summary: `ports.runs.encode_live`), `listen_queue` the workers' ("queued", or "cancel RUN_ID").
Both may lose what was sent while disconnected, so every listener also polls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from rlm_mcp.call_lines import CallLine
from rlm_mcp.errors import BusyError
from rlm_mcp.events import RunEvent
from rlm_mcp.ports.run_values import RunPhase
from rlm_mcp.ports.runs import RunRecord, WorkerRef

__all__ = [
    "Beat",
    "FencedRunLog",
    "FencedRunStore",
    "LostWorker",
    "QueueRules",
    "RunQueuePort",
    "RunRow",
    "RunState",
    "SweepLook",
    "shown",
]


class RunState(StrEnum):
    """A run's state in the queue (the values are the database's `rlm_runs.state`)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True)
class ClaimPins:
    """A claimed run's contexts, pinned by its claim (PostgreSQL's: the claim's statement pins
    them as the context store would): the pin id and each context's row as the claim read it,
    in the request's order (`store.context_model.context_info` reads one)."""

    pin_id: str
    rows: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class RunRow:
    """A run's row as the queue sees it; `summary` is its record, decoded once when read."""

    run_id: str
    owner: str
    state: RunState
    attempt: int
    summary: RunRecord
    worker_id: int | None
    lm_called: bool
    requeues: int
    next_seq: int
    log_bytes: int
    created_at: float
    cancel_requested: bool
    # A front follows its progress (a hint for latency only: no rule reads it; `follow_progress`).
    followed: bool = False
    # Its contexts, when its claim pinned them (else None: the worker pins them as the run starts).
    pins: ClaimPins | None = None

    @property
    def done(self) -> bool:
        return self.state is RunState.DONE

    @property
    def shown(self) -> RunRecord:
        """Its record as a reader is shown it (`shown`)."""
        return shown(self.summary, self.state, self.worker_id)


def shown(record: RunRecord, state: RunState | str, worker_id: int | None) -> RunRecord:
    """A run's record as every reader of its status is shown it (a front's mirror, `rlm_status`
    on any replica, the run's listing): a run a worker claimed (`state` running, `worker_id`
    set) whose record still says queued, because its worker has not published a live summary
    yet, shows as running, in its first phase, turn 0, as a run that has just taken its slot
    in one process does; any other record as it is (a process's own runs, with no worker, write
    their queued time themselves)."""
    if record.status != "queued" or state != RunState.RUNNING or worker_id is None:
        return record
    return record.model_copy(update={"status": "running", "phase": RunPhase.STARTING, "notice": None})


@dataclass(frozen=True)
class Beat:
    """A worker's heartbeat: whether its registration stands, and the runs the queue says it
    holds now, each with the attempt it claimed and whether a cancel was asked for."""

    registered: bool
    held: dict[str, tuple[int, bool]]


@dataclass(frozen=True)
class LostWorker:
    worker_id: int
    owner_id: str
    host: str


@dataclass(frozen=True)
class SweepLook:
    """What a sweep reads, in one look (`sweep_look`), as of the same instant: seconds until the
    oldest live worker's lease ends (None: no live worker) and since the database started, the
    runs of workers past their lease, those workers (owners with no live worker left), and the
    owners with a live one."""

    oldest_s: float | None
    up_s: float
    lost_runs: list[str]
    lost_workers: list[LostWorker]
    live_owners: set[str]


@dataclass(frozen=True)
class QueueRules:
    """What the queue's implementations apply, derived from the settings by the service
    (`service.queue.rules.queue_rules`): the lease, the queue timeout, the waiting bounds (and
    the error for one run over them), each owner's share of the live workers' run slots."""

    lease_s: float
    queue_timeout_s: float
    max_queued: int
    max_queued_per_owner: int
    share: Callable[[int], int]  # an owner's share of `slots` live run slots
    refusal: Callable[[int, int], BusyError | None]  # (queued, queued by the owner) -> the error, or None


class RunQueuePort(Protocol):
    # --- fronts
    async def enqueue(
        self,
        record: RunRecord,
        need: int,
        *,
        prefer_worker: int | None = None,
        prefer_s: float = 0.0,
        wake_workers: bool = True,
    ) -> None:
        """Queue the run unless a waiting bound is reached (`BusyError`, counted under the same
        lock as the insert) or its owner holds no context by one of the ids its request names
        (`record.request.context_ids`) at the insert (the unknown-context error of `Contexts.get`;
        nothing written). The in-memory queue has no contexts: it checks none. `wake_workers`:
        tell the workers a run is queued ("queued" on the queue's wake-ups) in the same statement;
        False for a run offered to this process's own worker (`service.queue.local`), which is
        woken in-process; `wake_workers()` tells the others later."""
        ...

    async def wake_workers(self) -> None:
        """Tell every worker to look at the queue ("queued" on the queue's wake-ups)."""
        ...

    async def read(self, run_id: str) -> RunRow | None: ...
    async def cancel(self, run_id: str, summary_if_queued: RunRecord) -> bool: ...
    async def follow_progress(self, run_id: str) -> None:
        """A front follows the run's progress: its row is marked (a claim reads the mark) and a
        running run's worker is told ("follow RUN_ID" on the queue's wake-ups). A hint for
        latency only: the worker then publishes its live summary at the live-summary interval
        rather than the unfollowed one; fencing, requeues and the final record never read it."""
        ...

    async def queued_counts(self, owner: str) -> tuple[int, int]: ...
    async def live_workers(self) -> int: ...
    async def gauges(self) -> tuple[int, float, int]: ...

    # --- workers
    async def register_worker(self, owner_id: str, slots: int) -> int: ...
    async def unregister_worker(self, worker_id: int) -> None: ...
    async def heartbeat(self, worker_id: int) -> Beat: ...
    async def claim(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, sessions: bool = True
    ) -> RunRow | None:
        """The next run for this worker, now `running` under a new attempt; None when no queued
        run fits. `sessions=False`: none of a kept session's runs (this worker's image cannot
        restore one)."""
        ...

    async def claim_many(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, limit: int, sessions: bool = True
    ) -> list[RunRow]:
        """Up to `limit` runs for this worker in one transaction, each now `running` under a new
        attempt of its own, in the order as many claims one after another would take them: each
        owner's picks counted against its share as they are made, their sandbox needs summed
        against `free_sandboxes` (the batch stops at the first that does not fit), and at most
        the eligible runs' share of one live worker (rounded up), so a burst spreads over the
        workers. Empty when no queued run fits."""
        ...

    async def any_queued(self) -> bool:
        """Whether any run is queued at all (one cheap look, no claim's lock): a worker's timed
        look asks this first and claims only then."""
        ...

    async def cancels(self, worker_id: int) -> list[str]: ...
    async def followed(self, worker_id: int) -> list[str]: ...
    async def requeue(self, run_id: str, attempt: int, summary: RunRecord) -> bool: ...
    async def finish(self, run_id: str, summary: RunRecord, *, attempt: int | None = None) -> bool: ...
    async def worker_ref(self, worker_id: int | None) -> WorkerRef: ...

    # --- sweepers
    async def sweep_look(self) -> SweepLook: ...
    async def end_or_requeue_lost(self, run_id: str) -> str | None: ...
    async def stale_queued(self) -> list[str]: ...
    async def time_out(self, run_id: str, reason: str) -> bool: ...
    async def forget_old_workers(self) -> None: ...
    async def mark_gone(self, worker_id: int) -> None: ...
    async def clock_skew_s(self) -> float: ...

    # --- wake-ups (never return; reconnect after a failure, calling `on_connect` each time)
    async def listen_runs(self, on_note: Callable[[str], None], *, on_connect: Callable[[], object]) -> None: ...
    async def listen_queue(
        self, on_note: Callable[[str], None], *, on_connect: Callable[[], object], on_disconnect: Callable[[], object]
    ) -> None:
        """The workers' notes; `on_disconnect` after each connection `on_connect` announced ends
        (lost, or the listener stopped): what is sent until the next `on_connect` is not heard."""
        ...

    # `listen_runs` hears only the runs followed here (and, on PostgreSQL, an earlier version's
    # workers): a follower says when it starts and stops following one; `follow_run` returns
    # once what is announced from then on reaches `listen_runs` (bounded).
    async def follow_run(self, run_id: str) -> None: ...
    def forget_run(self, run_id: str) -> None: ...
    async def listener_alive(self, within_s: float) -> bool:
        """Whether `listen_runs`' session answers a round trip within `within_s`: True when it
        does, so nothing announced before it was lost (False: not connected, or no answer)."""
        ...


class RunPins(Protocol):
    """A run's context pins as its final write sees them (`store.context_model.HeldPins`): the
    pin id to remove (None: none held), and `mark_removed`, called by the write that removed them."""

    @property
    def to_release(self) -> str | None: ...
    def mark_removed(self) -> None: ...


class FencedRunLog(Protocol):
    """A worker's log of one run, written under the claim's attempt: every flush writes only
    while the run is still `running` under it (False otherwise, and nothing is written)."""

    @property
    def run_id(self) -> str: ...
    @property
    def staged(self) -> int: ...
    @property
    def detached(self) -> bool: ...
    async def open(self) -> None: ...
    def stage(self, event: RunEvent) -> None: ...
    def stage_call(self, call: CallLine) -> None:
        """`stage(call.event())`: an LM call's event, staged from its line's values."""
        ...

    async def flush(
        self, *, summary: RunRecord | None = None, mark_lm_called: bool = False, announce: bool = False
    ) -> bool: ...
    async def finish(self, summary: RunRecord, *, pins: RunPins | None = None) -> bool:
        """The staged events and the final record in one write, fenced by the attempt as the
        queue's `finish` is; True if this call ended the run. `pins`: the run's context pins,
        which a log that can removes in the same write, whatever the fence says (they are this
        process's own, let go at the run's end either way), then `mark_removed`."""
        ...

    async def aclose(self) -> None: ...
    def detach(self) -> None: ...


class FencedRunStore(Protocol):
    """Where a worker reopens the log of a run it claimed (`attempt`: the claim's)."""

    async def reopen(self, run_id: str, *, attempt: int | None = None) -> FencedRunLog: ...
    def reopen_claimed(self, row: RunRow) -> FencedRunLog:
        """`reopen(row.run_id, attempt=row.attempt)` without reading the row again: the claim's
        own row says where the log goes on (a worker's every run saved that round trip)."""
        ...
