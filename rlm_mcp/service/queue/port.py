"""The run queue's port: every operation on a team-mode run's state and its workers' state.

One implementation (`state.PgRunQueue`) holds every statement on `rlm_runs`' state and on
`rlm_workers`; the front, the worker and the sweeper use only this. A run's states:

    queued --claim (attempt + 1, worker, claimed_at)--> running --finish--> done
      ^                                                   |
      +-- requeue (the worker hands it back, or its worker was lost before any answered LM
          call; once) ------------------------------------+
    queued --cancel, queue timeout--> done

Every write a worker makes for a run names the attempt it claimed (`attempt`): one that matches
nothing means the run is no longer this worker's (ended elsewhere, or claimed again after this
worker was declared lost), and the worker stops it at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rlm_mcp.ports.runs import RunRecord, WorkerRef


@dataclass(frozen=True)
class RunRow:
    """A run's row as the queue sees it (`summary` is the run's record as JSON)."""

    run_id: str
    owner: str
    state: str  # queued | running | done
    attempt: int
    summary: dict[str, Any]
    worker_id: int | None
    lm_called: bool
    requeues: int
    next_seq: int
    log_bytes: int
    created_at: float
    cancel_requested: bool

    @property
    def done(self) -> bool:
        return self.state == "done"


@dataclass(frozen=True)
class Beat:
    """A worker's heartbeat: whether its registration stands, and the runs the database says it
    holds now, each with the attempt it claimed and whether a cancel was asked for."""

    registered: bool
    held: dict[str, tuple[int, bool]]


@dataclass(frozen=True)
class LostWorker:
    worker_id: int
    owner_id: str
    host: str


class RunQueuePort(Protocol):
    # --- fronts
    async def enqueue(
        self, record: RunRecord, need: int, *, prefer_worker: int | None = None, prefer_s: float = 0.0
    ) -> None: ...
    async def read(self, run_id: str) -> RunRow | None: ...
    async def cancel(self, run_id: str, summary_if_queued: RunRecord) -> bool: ...
    async def queued_counts(self, owner: str) -> tuple[int, int]: ...
    async def live_workers(self) -> int: ...
    async def gauges(self) -> tuple[int, float, int]: ...

    # --- workers
    async def register_worker(self, owner_id: str, slots: int) -> int: ...
    async def unregister_worker(self, worker_id: int) -> None: ...
    async def heartbeat(self, worker_id: int) -> Beat: ...
    async def claim(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, sessions: bool = True
    ) -> RunRow | None: ...
    async def cancels(self, worker_id: int) -> list[str]: ...
    async def requeue(self, run_id: str, attempt: int, summary: RunRecord) -> bool: ...
    async def finish(self, run_id: str, summary: RunRecord, *, attempt: int | None = None) -> bool: ...
    async def worker_ref(self, worker_id: int | None) -> WorkerRef: ...

    # --- sweepers
    async def sweep_plan(self) -> tuple[float | None, float]: ...
    async def lost_runs(self) -> list[str]: ...
    async def end_or_requeue_lost(self, run_id: str) -> str | None: ...
    async def stale_queued(self) -> list[str]: ...
    async def time_out(self, run_id: str, reason: str) -> bool: ...
    async def forget_old_workers(self) -> None: ...
    async def workers(self) -> tuple[list[LostWorker], set[str]]: ...
    async def mark_gone(self, worker_id: int) -> None: ...
    async def clock_skew_s(self) -> float: ...
