"""The worker's side of the run queue: claim a queued run, execute it here, report as it goes.

Claims: `claims.Claims` (when this worker looks at the queue, and what it may claim). A run's
child RLMs (`rlm_query`) run inside the root run's engine here, never through the queue.

Fencing. Each claim is a new attempt; every write for the run names it, and one that matches
nothing (`QueueRunLog.must_stop`) stops the run at once: its scope is cancelled, which removes its
sandbox, and nothing more is written. The run's engine asks `_must_stop` before each LM call and
each cell (the `fence` handed to `RunManager.adopt`). The heartbeat (the database's `now()`) also
returns the runs the database says this worker holds: a run missing from it is stopped, a cancel
asked for is applied.
A worker whose own monotonic clock says its last successful heartbeat is older than the lease (it
was frozen, or cut off, or the database is away) lets none of its runs go on to an LM call or a
cell, and claims nothing, until a heartbeat answers again: then the runs the database no longer
lists as its own (the sweepers gave them away meanwhile) stop, and the others go on. So a frozen
and resumed worker never acts on a run another worker took up, and a database outage longer than
the lease loses no run (the sweepers wait a full lease after the database is back before they
judge any lease, and this worker heartbeats well within it).

Kept sessions (`sessions.WorkerSessions`): a run that continues one gets the session's live REPL
when this worker holds it, else a fresh one restored from the database; the session's end is
recorded before the run's final record, its snapshot taken after it.

Stopping (SIGTERM): runs that have had no LM reply yet are handed back to the queue (once, as
the sweepers would after a crash) with their log detached, so another worker starts them from
scratch; the others end `cancelled`, naming this worker.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.queue import FencedRunStore, RunQueuePort, RunRow
from rlm_mcp.ports.runs import Notice, NoticeKind, RunRecord, WorkerRef, may_requeue
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue import final_writes
from rlm_mcp.service.queue.claims import Claims
from rlm_mcp.service.queue.ends import EndReporting, not_started
from rlm_mcp.service.queue.follows import FollowedRuns
from rlm_mcp.service.queue.local import LocalLane
from rlm_mcp.service.queue.publishing import publish_until_done
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.service.queue.sessions import WorkerSessions
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.context_model import HeldPins, context_info
from rlm_mcp.ticks import sleep_to_tick

log = logging.getLogger("rlm_mcp.queue")


class QueueWorker:
    def __init__(
        self,
        settings: QueueSettings,
        queue: RunQueuePort,
        run_store: FencedRunStore,
        runs: RunManager,
        sandboxes: SandboxManager,
        engine: Callable[[], Awaitable[RLMEngine]],
        *,
        sessions: WorkerSessions | None = None,
        ends: RunEnds | None = None,
        lane: LocalLane | None = None,
    ) -> None:
        """`sessions`: the kept sessions' sandboxes this worker holds between runs, built by the
        assembly (which also made them the sandboxes' `reclaim`); entered and closed here, around
        the runs (None: this worker runs none). `ends`: the run-end hook, told of each run end
        this worker's write makes. `lane`: the link to this process's own front (`local.py`: a
        `both` replica), which offers it runs and hears theirs in-process."""
        self._settings = settings
        # Every end this worker writes (the final record, a run that could not start or was
        # stopped unrecorded) goes through the queue's `finish`, which tells the run-end hook.
        self._reporting = EndReporting(queue, ends if ends is not None else RunEnds())
        self._queue: RunQueuePort = self._reporting
        self._run_store = run_store
        self._runs = runs
        self._sandboxes = sandboxes
        self._engine = engine
        self._running: dict[str, tuple[int, ActiveRun, QueueRunLog]] = {}  # run id -> (attempt, run, log)
        self._stopped: dict[str, str] = {}  # run id -> why this worker stopped it (fenced)
        self._handing_back: set[str] = set()  # runs given back to the queue at shutdown
        self._requeues: dict[str, int] = {}  # run id -> how often it was queued again before
        self._claimed_at: dict[str, float] = {}  # run id -> when its claim returned (monotonic)
        self._follows = FollowedRuns(settings.publish)  # the runs a front follows: their publish interval
        self._beat_at = time.monotonic()  # the start of the last successful heartbeat
        self._beaten = anyio.Event()  # set (and replaced) after each successful heartbeat
        self._tg: anyio.abc.TaskGroup | None = None
        self.worker_id: int | None = None
        self.sessions = sessions
        if sessions is not None:
            sessions.worker_id = lambda: self.worker_id  # the holder the database names
        self.claims = Claims(
            settings,
            self._queue,
            sandboxes,
            sessions,
            worker_id=lambda: self.worker_id,
            lease_lapsed=self._lease_lapsed,
            running=lambda: len(self._running),
        )
        self._lane = lane
        if lane is not None:
            lane.room = lambda: self.worker_id if self.claims.has_room() else None
            lane.wake_worker = lambda: self.claims.wake(at_once=True)
            lane.mark_followed = self._follows.mark

    @property
    def ref(self) -> WorkerRef:
        """This worker, as notices name it."""
        return WorkerRef(worker_id=self.worker_id, host=socket.gethostname(), pid=os.getpid())

    @property
    def name(self) -> str:
        return self.ref.render()

    async def __aenter__(self) -> QueueWorker:
        await self._register()
        if self.sessions is not None:
            await self.sessions.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for task in (self._heartbeat, self._listen, self._poll_cancels):
            self._tg.start_soon(task)
        # Handed its group: a worker stopped at once may exit (clearing `_tg`) before this starts.
        self._tg.start_soon(self.claims.claim_forever, functools.partial(self._start, self._tg))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        tg, self._tg = self._tg, None
        self._runs.shutdown_notice = Notice(kind=NoticeKind.SHUT_DOWN, worker=self.ref)
        # Runs with no LM reply recorded yet go back to the queue (once) instead of ending:
        # another worker starts them from scratch and nothing was spent.
        for run_id, (_, _, run_log) in list(self._running.items()):
            if may_requeue(lm_called=run_log.lm_called, requeues=self._requeues.get(run_id, 1)):
                run_log.detach()
                self._handing_back.add(run_id)
        tg.cancel_scope.cancel()  # each run records `cancelled` (or is handed back)
        await tg.__aexit__(None, None, None)
        if self.sessions is not None:
            await self.sessions.__aexit__(None, None, None)  # their sandboxes go; the sessions stay in the database
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                if self.worker_id is not None:
                    await self._queue.unregister_worker(self.worker_id)
            except Exception as exc:  # the sweepers will find it silent
                log.info("could not unregister %s: %s", self.name, exc)

    async def _register(self) -> None:
        started = time.monotonic()
        self.worker_id = await self._queue.register_worker(self._sandboxes.owner_id, self._settings.max_runs)
        self._beat_at = started
        # Said now: a shutdown's cancellation may reach a run before `__aexit__` runs.
        self._runs.shutdown_notice = Notice(kind=NoticeKind.SHUT_DOWN, worker=self.ref)
        log.info("queue %s registered", self.name)

    # --- liveness and fencing -------------------------------------------------------------

    def _lease_lapsed(self) -> bool:
        return time.monotonic() - self._beat_at > self._settings.worker_lease_s

    async def _must_stop(self, run_id: str, run_log: QueueRunLog) -> bool:
        """The fence the run's engine awaits before each LM call and each cell: True stops the
        run; while this worker's lease has lapsed by its own clock, it waits for a heartbeat's
        verdict first."""
        while self._lease_lapsed() and run_id not in self._stopped:
            beaten = self._beaten
            await beaten.wait()
        if run_log.unrecorded:
            run_log.detach()  # its end is written by `final_writes.end_unrecorded`, not as `cancelled`
            return True
        if run_id in self._stopped:
            return True
        if run_log.must_stop is not None:
            self._stopped[run_id] = run_log.must_stop
            run_log.detach()
            log.warning("run %s stopped on %s: %s", run_id, self.name, run_log.must_stop)
            return True
        return False

    def _stop(self, run_id: str, why: str) -> None:
        """Stop a run that is no longer this worker's: cancel it, write nothing more for it."""
        held = self._running.get(run_id)
        if held is None or run_id in self._stopped:
            return
        self._stopped[run_id] = why
        _, run, run_log = held
        run_log.detach()
        log.warning("run %s stopped on %s: %s", run_id, self.name, why)
        if run.scope is not None:
            run.scope.cancel()  # its sandboxes are removed as the run unwinds

    @property
    def _beat_interval(self) -> float:
        return max(0.2, min(10.0, self._settings.worker_lease_s / 3))

    async def _heartbeat(self) -> None:
        interval = self._beat_interval
        while True:
            await sleep_to_tick(interval)  # with the process's other timers (rlm_mcp/ticks.py)
            assert self.worker_id is not None
            started = time.monotonic()
            try:
                beat = await self._queue.heartbeat(self.worker_id)
            except Exception as exc:  # PostgreSQL restarting: keep trying (the watch stops runs)
                log.info("queue heartbeat failed: %s", exc)
                continue
            # The verdict first (the runs another worker took up stop), then the lease renews.
            # A run claimed after this beat began may be missing from its rows: the next beat judges it.
            for run_id, (attempt, _, _) in list(self._running.items()):
                if self._claimed_at.get(run_id, started) > started:
                    continue
                mine = beat.held.get(run_id)
                if mine is None or mine[0] != attempt:
                    self._stop(run_id, "the run is no longer this worker's (another attempt, or it ended)")
                elif mine[1]:
                    self._cancel(run_id)
            self._beat_at = started
            self._beaten.set()
            self._beaten = anyio.Event()
            if not beat.registered:  # declared lost (a long outage) and marked gone: start afresh
                log.warning("%s was declared lost by the other workers; registering again", self.name)
                try:
                    await self._register()
                except Exception as exc:
                    log.info("could not register again: %s", exc)

    async def _listen(self) -> None:
        def on_note(payload: str) -> None:
            if payload == "queued":
                self.claims.wake()
            elif payload.startswith("cancel "):
                self._cancel(payload.removeprefix("cancel "))
            elif payload.startswith("follow "):
                self._follows.mark(payload.removeprefix("follow "))

        def on_connect() -> None:
            self.claims.connected()
            self._follows.recheck = True  # follow notes sent while it was down are lost

        await self._queue.listen_queue(on_note, on_connect=on_connect, on_disconnect=self.claims.disconnected)

    async def _poll_cancels(self) -> None:
        """Wake-ups are lost across reconnects: the cancels asked for are read every poll
        interval, and the follows once after a reconnect (`follows.FollowedRuns`). The heartbeat
        reads them too (each held run's flag): while it beats at least every poll interval and
        its last beat answered (within two beats), this read would tell nothing newer, and is
        left to it."""
        poll = self._settings.queue_poll_s
        while True:
            await sleep_to_tick(poll)  # with uvicorn's tick (rlm_mcp/ticks.py)
            if not self._running or self.worker_id is None:
                continue
            beats = self._beat_interval <= poll and time.monotonic() - self._beat_at < 2 * self._beat_interval
            try:
                for run_id in [] if beats else await self._queue.cancels(self.worker_id):
                    self._cancel(run_id)
            except Exception as exc:
                log.info("could not read the runs to cancel: %s", exc)
            if self._follows.recheck and not all(self._follows.followed(r) for r in self._running):
                try:
                    for run_id in await self._queue.followed(self.worker_id):
                        self._follows.mark(run_id)
                    self._follows.recheck = False
                except Exception as exc:  # asked again at the next poll
                    log.info("could not read the runs followed: %s", exc)

    def _cancel(self, run_id: str) -> None:
        held = self._running.get(run_id)
        if held is not None and held[1].scope is not None:
            held[1].scope.cancel()  # the run records `cancelled`, its sandbox is removed

    def _start(self, tg: anyio.abc.TaskGroup, row: RunRow) -> None:
        """Run a row just claimed (its run slot is released at its end)."""
        self._claimed_at[row.run_id] = time.monotonic()
        tg.start_soon(self._process, row)

    async def _process(self, row: RunRow) -> None:
        try:
            await self._execute(row)
        except Exception:
            log.exception("queued run %s failed", row.run_id)
        finally:
            self._running.pop(row.run_id, None)
            self._stopped.pop(row.run_id, None)
            self._requeues.pop(row.run_id, None)
            self._claimed_at.pop(row.run_id, None)
            self._handing_back.discard(row.run_id)
            self._follows.forget(row.run_id)
            self.claims.release()

    async def _execute(self, row: RunRow) -> None:
        pins = claimed_pins(row)
        # Offered by this process's front (`local.LocalLane`): it hears the run from here.
        lane = self._lane if self._lane is not None and self._lane.take(row.run_id) else None
        if lane is not None:
            lane.announce(row.run_id, row.shown)  # claimed: running, in its first phase
        try:
            await self._execute_claimed(row, pins, lane=lane)
        finally:
            if lane is not None:
                lane.released(row.run_id)  # no final record delivered: its front reads the row
            if pins is not None and not pins.handed_over:  # the run never started here: its claim's pins go
                await self._runs.release_pins(pins)

    async def _execute_claimed(self, row: RunRow, pins: HeldPins | None, *, lane: LocalLane | None = None) -> None:
        """`lane`: this process's front follows the run in-process (`local.LocalLane`)."""
        run_id, attempt = row.run_id, row.attempt
        request = row.summary.request
        if row.followed:  # followed while it was queued
            self._follows.mark(run_id)
        engine = await self._engine()
        run: ActiveRun | None = None

        def hand_back() -> bool:
            """At the run's end: a run ended by this process's shutdown before any LM reply goes
            back to the queue (decided here too, as the shutdown's cancellation may reach the
            run before `__aexit__` does)."""
            if run is None or not run.shut_down or not may_requeue(lm_called=run_log.lm_called, requeues=row.requeues):
                return False
            self._handing_back.add(run_id)
            return True

        fenced = self._run_store.reopen_claimed(row)

        async def finish(final: RunRecord) -> bool:
            # The log's last events, the end write (fenced by the attempt) and the release of the
            # run's context pins in one statement: the pins' exit then sends nothing of its own.
            pins = run.pins if run is not None else None
            return await self._reporting.finish_by(lambda: fenced.finish(final, pins=pins), final)

        announced = functools.partial(lane.announce, run_id) if lane is not None else None
        run_log = QueueRunLog(fenced, hand_back=hand_back, finish=finish, announced=announced)
        self._requeues[run_id] = row.requeues
        sessions = self.sessions if request.session_id is not None else None
        try:
            repl = await sessions.prepare(request) if sessions is not None else None
        except RlmMcpError as exc:  # its session cannot go on: a tool error for its caller
            with anyio.CancelScope(shield=True):
                await self._queue.finish(run_id, not_started(row.summary, exc), attempt=attempt)
            return

        def leaving() -> bool:  # no longer this worker's, or back to the queue (same session, elsewhere)
            return run_id in self._stopped or run_log.unrecorded or run_id in self._handing_back or hand_back()

        run = await self._runs.adopt(
            run_id,
            request,
            engine,
            run_log,
            fence=lambda: self._must_stop(run_id, run_log),
            repl=repl,
            on_result=sessions.on_result(leaving) if sessions is not None else None,
            on_end=sessions.ended if sessions is not None else None,
            pins=pins,
        )
        run.notice = Notice(kind=NoticeKind.RUNNING_ON, worker=self.ref)
        self._running[run_id] = (attempt, run, run_log)
        try:
            await publish_until_done(
                run, run_log, self._settings, self._follows, stopped=self._stopped, stop=self._stop
            )
        finally:
            with anyio.CancelScope(shield=True):
                if not run.done.is_set():  # this worker is shutting down
                    if run.scope is not None:
                        run.scope.cancel()
                    await run.done.wait()
                if run_id in self._stopped:
                    pass  # no longer this worker's: nothing more is written
                elif run_id in self._handing_back:
                    await final_writes.hand_back(self._queue, run, run_log, attempt, self.ref)
                elif run_log.unrecorded:
                    # Its first LM reply was not recorded: the database says no answered call.
                    fresh = may_requeue(lm_called=False, requeues=row.requeues)
                    await final_writes.end_unrecorded(self._queue, run, attempt, self.ref, fresh=fresh)
                else:
                    await final_writes.ensure_final(self._queue, run, run_log, attempt)


def claimed_pins(row: RunRow) -> HeldPins | None:
    """The run's contexts as its claim pinned them (None: the run pins them as it starts)."""
    if row.pins is None:
        return None
    infos = [context_info(r) for r in row.pins.rows]
    return HeldPins.claimed(row.pins.pin_id, infos)
