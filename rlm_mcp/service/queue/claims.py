"""The worker's claims (`worker.QueueWorker`): when it looks at the queue, and what it claims.

Claims (`RunQueuePort.claim_many`) are gated inside their statement: a worker claims only while
it has a free run slot (RLM_MCP_MAX_RUNS), up to as many runs as it has free run slots in one
transaction, and only runs whose sandbox needs (max_depth, the no-deadlock rule of
`sandbox/slots.py`), summed, fit the sandbox slots free here; the per-owner share and the fair
order are the claim's too, counted run by run inside the batch. Idle sessions' sandboxes count as free slots for a claim: a
run that needs one takes it (least recently used first).

When it looks. A worker looks at once while it has a free run slot and was woken (a "queued"
note on the queue's channel, its listener's (re)connect); with no wake-up within the poll
interval (RLM_MCP_QUEUE_POLL_S) it looks anyway: the timed look first asks whether any run is
queued at all (`any_queued`, one statement) and claims only then. While the queue's listener is
connected and the last look found no run queued at all, the next timed look waits
RLM_MCP_QUEUE_IDLE_POLL_S instead: every statement that queues a run (enqueue, requeue) notifies
"queued" in the same statement, so a run queued after that look wakes the worker. Runs queued but
not claimable here (another worker preferred, an owner's share, sandbox slots) keep the poll
interval, as does a worker whose listener is down: its loss (`disconnected`) wakes the worker,
which looks at once and then every poll interval until the listener is back. The bound this
leaves: a run queued while the listener's connection is silently dead (until its keep-alive
finds it so) may wait up to RLM_MCP_QUEUE_IDLE_POLL_S for an idle worker.

Spreading: woken for a newly queued run while already running some, a worker waits SPREAD_S per
run it runs before claiming, so an idler worker takes it first; a backlog is claimed at once, and
so is a run this process's own front offered to this worker (`local.LocalLane`: no other worker
was told of it). One claim takes at most the eligible runs' share of one live worker (rounded
up), so a burst queued at once still goes to every worker with free slots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.queue import RunQueuePort, RunRow
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.final_writes import RETRY_S
from rlm_mcp.service.queue.sessions import WorkerSessions
from rlm_mcp.ticks import until_tick

log = logging.getLogger("rlm_mcp.queue")

SPREAD_S = 0.05  # per run already executing here, before claiming a newly queued one


class Claims:
    """The claim loop of one worker: claims while a run slot is free, hands each row claimed to
    `start` (which runs it and calls `release` at its end)."""

    def __init__(
        self,
        settings: QueueSettings,
        queue: RunQueuePort,
        sandboxes: SandboxManager,
        sessions: WorkerSessions | None,
        *,
        worker_id: Callable[[], int | None],
        lease_lapsed: Callable[[], bool],
        running: Callable[[], int],
    ) -> None:
        self._settings = settings
        self._queue = queue
        self._sandboxes = sandboxes
        self._sessions = sessions
        self._worker_id = worker_id
        self._lease_lapsed = lease_lapsed
        self._running = running
        self._slots = anyio.Semaphore(settings.max_runs)
        self._wake = anyio.Event()
        self._listening = False  # the queue's listener is connected: every run queued wakes us
        self._empty = False  # the last look found no run queued at all
        self._at_once = False  # the next look skips the spreading wait (a run offered to this worker)
        self._spreading: anyio.CancelScope | None = None  # the spreading wait, while it waits
        self._claiming = 0  # free run slots the loop holds for its claim (spreading wait included)

    def wake(self, *, at_once: bool = False) -> None:
        """Look at the queue now (a run was queued, or wake-ups may have been lost); `at_once`:
        without the spreading wait (a run this process's front offered to this worker:
        `service.queue.local`)."""
        self._at_once = self._at_once or at_once
        self._wake.set()
        if at_once and self._spreading is not None:
            self._spreading.cancel()

    def has_room(self) -> bool:
        """Whether a claim now could take a run: a run slot no claimed run holds (a claim in flight
        holds the free ones only for its statement) and a free sandbox slot, the lease current."""
        return (
            self._slots.value + self._claiming > 0
            and self._free_sandboxes >= 1
            and not self._lease_lapsed()
            and self._worker_id() is not None
        )

    def connected(self) -> None:
        """The queue's listener (re)connected: notes sent while it was down are lost, look now."""
        self._listening = True
        self._wake.set()

    def disconnected(self) -> None:
        """The queue's listener lost its connection: no run queued from now on announces itself
        here; a timed look at once, then every poll interval."""
        self._listening = False
        self._wake.set()

    def idle_wait_s(self) -> float:
        """How long the loop waits for a wake-up before its next timed look."""
        if self._listening and self._empty:
            return self._settings.queue_idle_poll_s
        return self._settings.queue_poll_s

    def release(self) -> None:
        """A run claimed here ended: its run slot is free."""
        self._slots.release()

    async def claim_forever(self, start: Callable[[RunRow], None]) -> None:
        waited = polled = False
        while True:
            await self._slots.acquire()
            held = 1 + self._more_slots()  # every run slot free now: one claim may fill them all
            self._claiming = held
            self._wake = anyio.Event()  # before the claim: a run queued during it wakes us
            at_once, self._at_once = self._at_once, False
            try:
                if waited and self._running() and not at_once:
                    # Woken for a new run while busy: leave it a moment to an idler worker, so
                    # runs spread over the workers (draining a backlog is never delayed); a run
                    # offered to this worker meanwhile ends the wait (`wake(at_once=True)`).
                    with anyio.move_on_after(SPREAD_S * self._running()) as self._spreading:
                        await anyio.sleep_forever()
                    self._spreading = None
                rows = await self._claim(held, polled=polled)
            except BaseException:
                self._claiming = 0
                for _ in range(held):
                    self._slots.release()
                raise
            self._claiming = 0
            for _ in range(held - len(rows)):
                self._slots.release()
            waited = not rows
            polled = False
            if not rows:
                # Due with the process's other timers (rlm_mcp/ticks.py): one wake-up between them.
                with anyio.move_on_after(until_tick(self.idle_wait_s())) as timer:
                    await self._wake.wait()
                # No wake-up within the interval, or the listener went away: the timed look.
                polled = timer.cancelled_caught or not self._listening
                continue
            for row in rows:
                start(row)

    def _more_slots(self) -> int:
        """Takes every other free run slot at once; how many."""
        taken = 0
        while True:
            try:
                self._slots.acquire_nowait()
            except anyio.WouldBlock:
                return taken
            taken += 1

    @property
    def _free_sandboxes(self) -> int:
        """Sandbox slots a claimed run may use: the free ones and those idle sessions hold."""
        return self._sandboxes.free_slots + (self._sessions.reclaimable if self._sessions is not None else 0)

    async def _claim(self, slots: int, *, polled: bool = False) -> list[RunRow]:
        """Up to `slots` runs (this worker's free run slots), bounded by its free sandbox slots:
        one transaction however many it takes."""
        while self._free_sandboxes < 1 or self._lease_lapsed():  # noqa: ASYNC110 (no event to wait on)
            await anyio.sleep(0.1)  # a sandbox closes within a run's lifetime: cheap to look
        try:
            worker_id = self._worker_id()
            assert worker_id is not None
            if polled:
                self._empty = not await self._queue.any_queued()
                if self._empty:
                    return []
            self._empty = False
            sessions = await self._can_restore_sessions()
            free = self._free_sandboxes
            return await self._queue.claim_many(
                worker_id, free, self._sandboxes.max_slots, limit=max(1, min(slots, free)), sessions=sessions
            )
        except Exception as exc:
            self._empty = False
            log.info("could not claim a run: %s", exc)
            await anyio.sleep(RETRY_S)
            return []

    async def _can_restore_sessions(self) -> bool:
        """Whether this worker may claim a kept session's run: its image can snapshot and restore
        a namespace (dill), as its first kernel said (one is started to ask, once). A worker
        that cannot leaves those runs to the others rather than restoring into an empty REPL."""
        if self._sessions is None:
            return True  # no session store: such runs run here without their session, as before
        if self._sandboxes.can_snapshot is None:
            try:
                await self._sandboxes.check_snapshots()
            except RlmMcpError as exc:
                if self._sandboxes.can_snapshot is False:
                    log.warning("this worker claims no kept session's run: %s", exc.cause)
            except Exception:  # the backend is away: asked again at the next claim
                log.info("could not ask the sandbox image whether it can restore a session", exc_info=True)
        return self._sandboxes.can_snapshot is not False
