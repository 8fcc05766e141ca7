"""The front's side of the run queue: enqueue a run, follow it through the database, cancel it.

`QueueFront` has the interface of the local `RunManager` (`service.backends.RunBackend`), so
`RlmService` and `rlm_complete`'s progress reporting do not know where a run executes. Each run
this process follows is an `ActiveRun` mirror, brought up to date by its wake-ups
(`wakeups.Wakeups`), in the listener's own callback: the live summary or final record a wake-up
carries is applied to the mirror there, and a run that ends is let go there. No task follows a
run: one is started only to read a run's row (a wake-up that carried nothing, a run found here
by `find`, a cancel), one read at a time per run, with what is heard meanwhile taken after it.
The process's one silence timer (`Wakeups.watch_silence`) has every followed run read its row
when the listener's session, quiet for a poll interval (RLM_MCP_QUEUE_POLL_S), does not answer a
round trip (else nothing was lost), and one task looks every poll interval, while runs are queued
here, whether a worker is alive (`no_worker.NoWorkerNotices`). A run nobody follows turn by turn
announces only its first live summary and its end: `find` reads its row before it answers. In a
`both` replica, the runs offered to its own worker are followed in-process instead
(`local.LocalLane`), until they fall back to this path.
Any replica follows any run (`find`), so `rlm_status`, `rlm_result(wait_s)` and `rlm_cancel`
work wherever they arrive.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.engine import RLMEngine, RunPhase, RunProgress
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.owners import OwnerScope, sees
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.queue import RunQueuePort, RunState
from rlm_mcp.ports.runs import LiveSummary, RunRecord, RunRequest, RunStatus, new_run_id
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue.ends import EndReporting, need_of
from rlm_mcp.service.queue.local import LocalLane
from rlm_mcp.service.queue.no_worker import NoWorkerNotices
from rlm_mcp.service.queue.wakeups import READ_ROW, Wakeups
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.runs import FINISHED_RUNS_KEPT

log = logging.getLogger("rlm_mcp.queue")

__all__ = ["QueueFront", "apply", "ended", "new_run_id"]  # new_run_id: the one source, `ports.runs`

_NOTHING = object()  # no wake-up kept for a run whose row is being read
Kept = LiveSummary | RunRecord | None | object  # a wake-up kept (READ_ROW: None), or _NOTHING


def ended(run: ActiveRun, status: RunStatus, reason: str) -> RunRecord:
    """The final record of a run that ends without its worker (cancelled while queued, lost)."""
    record = run.record().ended(status, reason)
    run.result = record.result
    run.progress.status = status
    return record


def apply(run: ActiveRun, state: LiveSummary | RunRecord) -> None:
    """Bring the mirror up to the run's live summary or record; notify its waiters when
    something changed."""
    p = run.progress
    before = (p.status, p.iterations, p.sub_calls, p.phase, run.notice, p.usage.total.total, run.waiting)
    p.apply(state)
    run.notice = state.notice
    if p.status != "queued":
        run.waiting = None  # the front's no-worker notice is a queued run's only
    if isinstance(state, RunRecord) and state.done and not run.done.is_set():
        run.result = state.result
        if state.not_started is not None:
            run.not_started = RlmMcpError(state.not_started.cause, state.not_started.fix)
        run.done.set()
        run.notify("run_end")
    elif before != (p.status, p.iterations, p.sub_calls, p.phase, run.notice, p.usage.total.total, run.waiting):
        run.notify(state.last_event or "progress")


class QueueFront:
    """Runs enqueued for workers (any replica's) and followed through the database."""

    local = False

    def __init__(
        self,
        settings: QueueSettings,
        queue: RunQueuePort,
        wakeups: Wakeups,
        *,
        ends: RunEnds | None = None,
        lane: LocalLane | None = None,
    ) -> None:
        """`ends`: the run-end hook, told when this front ends a run (cancelled while queued).
        `lane`: the link to this process's own worker (`local.py`: a `both` replica)."""
        self._settings = settings
        self._queue: RunQueuePort = EndReporting(queue, ends if ends is not None else RunEnds())
        self._wakeups = wakeups
        self._mirrors: dict[str, ActiveRun] = {}
        self._finished: collections.deque[str] = collections.deque()
        self._follows_said: set[str] = set()  # mirrored runs whose follow was said (`follow_progress`)
        self._tg: anyio.abc.TaskGroup | None = None
        # Runs whose row is being read, with the latest wake-up heard meanwhile (taken after the read).
        self._reading: dict[str, Kept] = {}
        # Wake-ups of runs followed but not mirrored yet (`start` follows before it enqueues).
        self._early: dict[str, LiveSummary | RunRecord | None] = {}
        self._no_worker = NoWorkerNotices(settings, self._queue)  # the queued runs' notice
        wakeups.on_wake = self._woken
        self._lane = lane
        self._offers: collections.deque[tuple[float, str]] = collections.deque()  # (window's end, run id)
        self._offered = anyio.Event()  # `_watch_offers` sleeps on it while no offer is open
        if lane is not None:
            lane.deliver = wakeups.wake_local
            lane.fall_back = self._fall_back_soon

    async def __aenter__(self) -> QueueFront:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._wakeups.listen_forever)
        self._tg.start_soon(self._wakeups.watch_silence, self._settings.queue_poll_s)
        self._tg.start_soon(self._no_worker.watch_forever)
        if self._lane is not None:
            self._tg.start_soon(self._watch_offers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        tg, self._tg = self._tg, None
        tg.cancel_scope.cancel()  # stops following; the runs go on on their workers
        await tg.__aexit__(None, None, None)

    async def start(
        self,
        request: RunRequest,
        engine: RLMEngine | None,
        *,
        run_id: str | None = None,
        prefer_worker: int | None = None,
        prefer_s: float = 0.0,
        contexts: Sequence[ContextSpec] | None = None,
    ) -> ActiveRun:
        """`run_id`: chosen by the caller (a kept session names its run before it is queued);
        `prefer_worker`: the worker that alone may claim it for `prefer_s` seconds; `contexts`:
        unused (the enqueue checks the request's are its owner's; the worker that claims the run
        reads and pins them)."""
        if self._tg is None:
            raise RuntimeError("QueueFront used outside its context")
        run_id = run_id or new_run_id()
        progress = RunProgress(
            run_id=run_id, max_iterations=request.limits.max_iterations, status="queued", phase=RunPhase.QUEUED
        )
        run = ActiveRun(run_id, request, progress)
        # Offered to this process's own worker when it has room (`local.LocalLane`): followed
        # in-process, no LISTEN. Else followed before it is queued: a worker may announce it as
        # soon as it is (a quick run, its end), and what is announced before the listener's
        # LISTEN is heard only at the poll.
        lane = self._lane if prefer_worker is None else None  # a kept session prefers its holder
        local = lane.offer(run_id) if lane is not None else None
        if lane is not None and local is not None:
            self._wakeups.follow_local(run_id)
            prefer_worker, prefer_s = local, lane.window_s
        else:
            await self._wakeups.follow(run_id)
        try:
            # Refused (BusyError) when a waiting bound is reached, counted with the insert under one
            # lock; refused as an unknown context when its owner no longer holds one it names
            # (the admission may have read them earlier: `service.run_contexts`).
            await self._queue.enqueue(
                run.record(),
                need_of(request),
                prefer_worker=prefer_worker,
                prefer_s=prefer_s,
                wake_workers=local is None,
            )
        except BaseException:
            if lane is not None:
                lane.withdraw(run_id)
            self._wakeups.forget(run_id)
            self._early.pop(run_id, None)
            raise
        self._follow(run, known=True)
        if lane is not None and local is not None:
            self._offers.append((time.monotonic() + lane.window_s, run_id))
            self._offered.set()
            lane.wake_worker()
        return run

    def get(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        run = self._mirrors.get(run_id)
        return run if run is not None and sees(owner, run.request.owner) else None

    async def find(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """The run, followed from here from now on; None when unknown, another owner's or ended
        (the caller then reads its record)."""
        known = self._mirrors.get(run_id)
        if known is not None:
            if not sees(owner, known.request.owner):
                return None
            await self._look(known)
            return known
        row = await self._queue.read(run_id)
        if row is None or row.done or not sees(owner, row.owner) or self._tg is None:
            return None
        await self._wakeups.follow(run_id)  # heard from now on: its row is read next (`_follow`)
        if (known := self._mirrors.get(run_id)) is not None:  # followed meanwhile, by another call
            return known if sees(owner, known.request.owner) else None
        if self._tg is None:  # stopped meanwhile
            self._wakeups.forget(run_id)
            self._early.pop(run_id, None)
            return None
        record = row.shown
        progress = RunProgress(run_id=run_id, max_iterations=record.request.limits.max_iterations, status="queued")
        run = ActiveRun(run_id, record.request, progress, created=record.created_at or row.created_at)
        apply(run, record)
        self._follow(run)
        return run

    async def follow_progress(self, run_id: str) -> None:
        """The one place a front says it follows a run's progress turn by turn (`RunBackend`):
        the run's row is marked, so its claim reads it, or its worker is told if it runs already
        (`RunQueuePort.follow_progress`); once per run followed here. A hint for latency only:
        nothing but the live summary's interval depends on it, and a failure is logged, not raised.
        A run offered to this process's worker is marked there in-process (`LocalLane.follow`);
        said again through the queue if it falls back (`_fall_back`)."""
        if run_id in self._follows_said:
            return
        if self._lane is not None and self._lane.follow(run_id):
            if run_id in self._mirrors:
                self._follows_said.add(run_id)
            return
        try:
            await self._queue.follow_progress(run_id)
        except Exception as exc:  # the database is restarting: the run is published, less often
            log.info("could not say run %s is followed: %s", run_id, exc)
            return
        if run_id in self._mirrors:  # forgotten when the run is let go (`_retire`)
            self._follows_said.add(run_id)

    async def let_go(self, context_id: str, *, owner: OwnerScope) -> bool:
        """Runs execute on workers, whose end statement releases their pins: nothing to wait for."""
        return False

    async def cancel(self, run_id: str, *, wait_s: float = 5.0) -> None:
        run = self._mirrors[run_id]
        # A queued run ends here (nobody else will write its end); a running one is cancelled
        # by its worker, which the queue tells (a wake-up, and its poll). Either way the row is
        # read next (the wake-up below).
        reason = "cancelled by the caller before a worker took it"
        await self._queue.cancel(run_id, run.record().ended("cancelled", reason))
        self._wakeups.wake(run_id)
        with anyio.move_on_after(wait_s):
            await run.done.wait()

    def _woken(self, run_id: str, state: LiveSummary | RunRecord | None) -> None:
        """A wake-up of a run followed here (`Wakeups.on_wake`, in the listener's callback): its
        live summary or final record applied to the mirror at once, READ_ROW a read of its row;
        kept, the latest one, while the row is being read or the run is not mirrored yet."""
        run = self._mirrors.get(run_id)
        if run is None:
            self._early[run_id] = state
        elif run_id in self._reading:
            self._reading[run_id] = state
        else:
            self._take(run, state)

    def _take(self, run: ActiveRun, state: LiveSummary | RunRecord | None) -> None:
        if state is READ_ROW:
            self._read_soon(run)
            return
        self._apply(run, state)
        if run.done.is_set():
            self._retire(run)

    def _follow(self, run: ActiveRun, *, known: bool = False) -> None:
        """Mirror the run (its wake-ups are followed already: `Wakeups.follow`); `known`: the
        mirror shows its row (the run was just queued here), else the row is read first."""
        assert self._tg is not None
        self._mirrors[run.run_id] = run
        early = self._early.pop(run.run_id, _NOTHING)
        if not known:
            self._read_soon(run)  # newer than anything heard before it
        elif early is not _NOTHING:
            self._take(run, early)  # type: ignore[arg-type]  # a wake-up kept: not _NOTHING
        self._no_worker.watch(run)

    def _read_soon(self, run: ActiveRun) -> None:
        """Read the run's row in a task of its own (one read at a time per run)."""
        assert self._tg is not None
        self._reading[run.run_id] = _NOTHING
        self._tg.start_soon(self._read, run)

    async def _read(self, run: ActiveRun) -> None:
        """Bring the mirror up to the run's row, then take what was heard meanwhile."""
        try:
            while True:
                if not await self._refresh(run) or run.done.is_set():
                    self._retire(run)
                    return
                kept = self._reading[run.run_id]
                self._reading[run.run_id] = _NOTHING
                if kept is _NOTHING:
                    return
                if kept is not READ_ROW:
                    self._apply(run, kept)  # type: ignore[arg-type]  # a summary or record
                    if run.done.is_set():
                        self._retire(run)
                    return
        finally:
            self._reading.pop(run.run_id, None)

    async def _watch_offers(self) -> None:
        """The runs offered to this process's worker whose window ended before it claimed them
        (`LocalLane.lapsed`) go the queue's usual way: every worker is told, and the front
        follows the run through the listener; never returns. One task for every offer."""
        assert self._lane is not None
        while True:
            if not self._offers:
                self._offered = anyio.Event()
                await self._offered.wait()
                continue
            ends, run_id = self._offers[0]
            await anyio.sleep(max(0.0, ends - time.monotonic()))
            self._offers.popleft()
            if self._lane.lapsed(run_id):
                try:
                    await self._queue.wake_workers()
                except Exception as exc:  # the database is restarting: the workers' own polls find it
                    log.info("could not wake the workers for run %s: %s", run_id, exc)
                self._fall_back_soon(run_id)  # its LISTEN does not hold up the next offer's window

    def _fall_back_soon(self, run_id: str) -> None:
        """`_fall_back` in a task of its own: an offer's window ended (`_watch_offers`), or its
        execution by this process's worker ended without a final record it delivered
        (`LocalLane.released`, called in the worker's task)."""
        if self._tg is not None:
            self._tg.start_soon(self._fall_back, run_id)

    async def _fall_back(self, run_id: str) -> None:
        """Follow a run offered to this process's worker through the listener from now on, then
        read its row (what was announced before the LISTEN is in it)."""
        run = self._mirrors.get(run_id)
        if run is None or run.done.is_set():
            return
        await self._wakeups.follow(run_id)
        if run.done.is_set():  # ended meanwhile (retired): nothing to follow
            self._wakeups.forget(run_id)
            return
        self._woken(run_id, READ_ROW)
        if run_id in self._follows_said:  # said in-process only: another worker may take the run up
            self._follows_said.discard(run_id)
            await self.follow_progress(run_id)

    def _retire(self, run: ActiveRun) -> None:
        """The run ended (or its record is gone): nothing more to follow; its mirror is kept
        among the last finished runs for the callers that ask after it."""
        self._wakeups.forget(run.run_id)
        self._follows_said.discard(run.run_id)
        self._no_worker.drop(run.run_id)
        self._finished.append(run.run_id)
        while len(self._finished) > FINISHED_RUNS_KEPT:
            self._mirrors.pop(self._finished.popleft(), None)

    async def _refresh(self, run: ActiveRun) -> bool:
        """Bring the mirror up to the run's row; False when the record is gone (the run ended)."""
        try:
            row = await self._queue.read(run.run_id)
        except Exception as exc:  # the database is restarting: keep following
            log.info("could not read run %s: %s", run.run_id, exc)
            return True
        if row is None:  # pruned: it ended long ago
            ended(run, "error", "the run's record is gone")
            run.done.set()
            run.notify("run_end")
            return False
        self._apply(run, row.shown)
        return True

    def _apply(self, run: ActiveRun, state: LiveSummary | RunRecord) -> None:
        """`apply`, and a run queued again (its worker handed it back, or was lost) is watched
        for its no-worker notice again."""
        apply(run, state)
        if state.status == "queued":
            self._no_worker.watch(run)

    async def _look(self, run: ActiveRun) -> None:
        """A mirror reads its row before it answers (`find`) when it may be behind: it says
        queued (a worker announces the runs nobody follows turn by turn only at their first
        live-summary tick, not at their claim), or nobody here follows the run turn by turn (its
        later live summaries are written to the row without a wake-up: `publish_until_done`).
        Nothing to read when a read of the row is under way already (what it brings is applied
        after it), nor for a run followed here, whose wake-ups keep its mirror current."""
        if run.done.is_set() or run.run_id in self._reading:
            return
        if run.progress.status != "queued" and run.run_id in self._follows_said:
            return
        seen = run.seq
        try:
            row = await self._queue.read(run.run_id)
        except Exception as exc:  # the database is restarting: the mirror answers as it stands
            log.info("could not read run %s: %s", run.run_id, exc)
            return
        # Only when nothing was heard meanwhile (a wake-up taken during the read is newer).
        if row is None or run.done.is_set() or run.run_id in self._reading or run.seq != seen:
            return
        if row.state is not RunState.QUEUED or run.progress.status != "queued":
            self._take(run, row.shown)
