"""One run from the moment it is accepted until its record is written (`ActiveRun`), and how a
caller waits on it.

An `ActiveRun` is what every run backend hands back: the local `RunManager` (service/runs.py)
executes it in this process; a team-mode front (service/queue/front.py) mirrors a run that a
worker executes. Its state is the engine's `RunProgress` plus what a waiter needs (a change
counter, the result or why it never started, notices); `snapshot()` and `record()` are its two
read views. What a mode hangs on a run's execution (a team worker's fence, a kept session's
REPL and end hooks) stays with the backend that executes it (`RunManager`), and the work hung
on every run's end with the run-end hook (`service.run_ends`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from rlm_mcp.engine import RunProgress, RunResult
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.runs import LiveState, Notice, NotStarted, RunRecord, RunRequest
from rlm_mcp.service.progress import HEARTBEAT_S
from rlm_mcp.service.views import RunSnapshot
from rlm_mcp.store.context_model import HeldPins


@dataclass
class ActiveRun:
    """A run from the moment it is accepted until its record is written."""

    run_id: str
    request: RunRequest
    progress: RunProgress
    created: float = field(default_factory=time.time)
    result: RunResult | None = None
    # Why the run never started (no slot, Docker gone, the LM endpoint unreachable at the
    # first call; see `RunNotStarted`): a waiting `rlm_complete` raises it as a tool error.
    not_started: RlmMcpError | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope | None = None
    _changed: anyio.Event = field(default_factory=anyio.Event)
    last_event: str | None = None
    # Counts notifications, so a waiter that was busy (sending progress) when one happened
    # still sees it: the Event alone is replaced on every notify and would lose it.
    seq: int = 0
    # Team mode: where the run executes, or why it went back to the queue (the record's notice)...
    notice: Notice | None = None
    # ... and the front's own, never stored: no live worker to take it. rlm_status shows both.
    waiting: Notice | None = None
    # Ended because its server shut down (cancelled from outside its own scope), set before
    # its final record is written (a team worker may hand such a run back instead).
    shut_down: bool = False
    # Holds one of the process's run slots (from the moment the slot gate hands it one).
    slotted: bool = False
    # Began executing (held a slot and started its engine): counted by the running-runs gauge.
    began: bool = False
    # Its contexts' pins are let go: a moment after its answer is out (they only guard against
    # eviction, so their release waits until the answer has gone; `RunManager.let_go`).
    released: anyio.Event = field(default_factory=anyio.Event)
    # Those pins: a team worker's final write removes them in its own statement (`HeldPins`).
    pins: HeldPins = field(default_factory=HeldPins)

    def notify(self, event_type: str) -> None:
        self.last_event = event_type
        self.seq += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_change(self, within_s: float, *, since: int | None = None) -> bool:
        """True if something happened within `within_s` seconds (or since notification `since`)."""
        if since is not None and self.seq != since:
            return True
        changed = self._changed
        with anyio.move_on_after(within_s):
            await changed.wait()
            return True
        return False

    def live(self) -> LiveState:
        """The run's live state now: the engine's counters with the record's notice."""
        return self.progress.live(notice=self.notice, last_event=self.last_event)

    def snapshot(self) -> RunSnapshot:
        """The run's status now (with the front's own notice, `waiting`, after the record's)."""
        return RunSnapshot.of(self.run_id, self.live(), self.result, waiting=self.waiting)

    def record(self) -> RunRecord:
        """The run's record now: its request, its live state and, once it ended, its result."""
        cause = self.not_started
        return RunRecord.of_live(
            self.live(),
            run_id=self.run_id,
            created_at=self.created,
            request=self.request,
            result=self.result,
            not_started=NotStarted(cause=cause.cause, fix=cause.fix) if cause is not None else None,
        )


async def wait_with_heartbeat(
    run: ActiveRun, report: Callable[[str | None], Awaitable[None]], *, heartbeat_s: float = HEARTBEAT_S
) -> RunResult:
    """Wait for `run` to end, calling `report` on every progress event and at least every
    `heartbeat_s` seconds (clients that reset their timeout on progress need this)."""
    seen = run.seq
    while not run.done.is_set():
        # One cancel scope until the heartbeat is due, its deadline moved at every wake: entering
        # a scope per wait cost more than the rest of a wake, and a turn wakes this once. The
        # deadline is lifted while a report is sent, so the heartbeat never interrupts one.
        with anyio.CancelScope() as heartbeat:
            while True:
                if run.seq == seen:
                    heartbeat.deadline = anyio.current_time() + heartbeat_s
                    await run._changed.wait()
                    if heartbeat.cancel_called:  # came due as it woke: a heartbeat, sent below
                        break
                    heartbeat.deadline = math.inf
                seen = run.seq
                if run.done.is_set():
                    break
                await report(run.last_event)
        if heartbeat.cancel_called:  # nothing happened for heartbeat_s
            seen = run.seq
            if not run.done.is_set():
                await report(None)
    assert run.result is not None
    return run.result
