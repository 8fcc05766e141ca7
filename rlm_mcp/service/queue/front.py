"""The front's side of the run queue: enqueue a run, follow it through the database, cancel it.

`QueueFront` has the interface of the local `RunManager` (`service.backends.RunBackend`), so
`RlmService` and `rlm_complete`'s progress reporting do not know where a run executes. Each run
this process follows is an `ActiveRun` mirror, refreshed whenever its wake-up arrives
(`wakeups.Wakeups`: from the live summary the wake-up carries, applied by the listener itself
while the run's watcher waits, else from the run's row, which the watcher reads), and from the
row after a poll interval (RLM_MCP_QUEUE_POLL_S) in which the listener heard nothing at all
(`Wakeups.watch_silence`: else nothing was lost). A queued run's watcher also looks every poll
interval whether a worker is alive (`_say_if_no_worker`). Any replica follows any run (`find`),
so `rlm_status`, `rlm_result(wait_s)` and `rlm_cancel` work wherever they arrive.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from collections.abc import Sequence

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.engine import RLMEngine, RunPhase, RunProgress
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.owners import OwnerScope, sees
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import LiveSummary, Notice, NoticeKind, RunRecord, RunRequest, RunStatus, new_run_id
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue.ends import EndReporting, need_of
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.runs import FINISHED_RUNS_KEPT

log = logging.getLogger("rlm_mcp.queue")

__all__ = ["QueueFront", "apply", "ended", "new_run_id"]  # new_run_id: the one source, `ports.runs`


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
    before = (p.status, p.iterations, p.sub_calls, p.phase, run.notice, p.usage.total.total)
    p.apply(state)
    run.notice = state.notice
    if isinstance(state, RunRecord) and state.done and not run.done.is_set():
        run.result = state.result
        if state.not_started is not None:
            run.not_started = RlmMcpError(state.not_started.cause, state.not_started.fix)
        run.done.set()
        run.notify("run_end")
    elif before != (p.status, p.iterations, p.sub_calls, p.phase, run.notice, p.usage.total.total):
        run.notify(state.last_event or "progress")


class QueueFront:
    """Runs enqueued for workers (any replica's) and followed through the database."""

    local = False

    def __init__(
        self, settings: QueueSettings, queue: RunQueuePort, wakeups: Wakeups, *, ends: RunEnds | None = None
    ) -> None:
        """`ends`: the run-end hook, told when this front ends a run (cancelled while queued)."""
        self._settings = settings
        self._queue: RunQueuePort = EndReporting(queue, ends if ends is not None else RunEnds())
        self._wakeups = wakeups
        self._mirrors: dict[str, ActiveRun] = {}
        self._finished: collections.deque[str] = collections.deque()
        self._follows_said: set[str] = set()  # mirrored runs whose follow was said (`follow_progress`)
        self._tg: anyio.abc.TaskGroup | None = None
        self._live_workers = 0
        self._workers_seen_at = float("-inf")
        self._workers_reading: anyio.Event | None = None  # a read of the live workers' count under way
        self._workers_read_ok = False
        wakeups.on_carried = self._carried

    async def __aenter__(self) -> QueueFront:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._wakeups.listen_forever)
        self._tg.start_soon(self._wakeups.watch_silence, self._settings.queue_poll_s)
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
        # Followed before it is queued: a worker may announce it as soon as it is (a quick run,
        # its end), and what is announced before the listener's LISTEN is heard only at the poll.
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
            )
        except BaseException:
            self._wakeups.forget(run_id)
            raise
        self._follow(run, known=True)
        return run

    def get(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        run = self._mirrors.get(run_id)
        return run if run is not None and sees(owner, run.request.owner) else None

    async def find(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """The run, followed from here from now on; None when unknown, another owner's or ended
        (the caller then reads its record)."""
        known = self._mirrors.get(run_id)
        if known is not None:
            return known if sees(owner, known.request.owner) else None
        row = await self._queue.read(run_id)
        if row is None or row.done or not sees(owner, row.owner) or self._tg is None:
            return None
        await self._wakeups.follow(run_id)  # heard from now on: its watcher reads the row next
        if (known := self._mirrors.get(run_id)) is not None:  # followed meanwhile, by another call
            return known if sees(owner, known.request.owner) else None
        if self._tg is None:  # stopped meanwhile
            self._wakeups.forget(run_id)
            return None
        record = row.summary
        progress = RunProgress(run_id=run_id, max_iterations=record.request.limits.max_iterations, status="queued")
        run = ActiveRun(run_id, record.request, progress, created=record.created_at or row.created_at)
        apply(run, record)
        self._follow(run)
        return run

    async def follow_progress(self, run_id: str) -> None:
        """The one place a front says it follows a run's progress turn by turn (`RunBackend`):
        the run's row is marked, so its claim reads it, or its worker is told if it runs already
        (`RunQueuePort.follow_progress`); once per run followed here. A hint for latency only:
        nothing but the live summary's interval depends on it, and a failure is logged, not raised."""
        if run_id in self._follows_said:
            return
        try:
            await self._queue.follow_progress(run_id)
        except Exception as exc:  # the database is restarting: the run is published, less often
            log.info("could not say run %s is followed: %s", run_id, exc)
            return
        if run_id in self._mirrors:  # forgotten with the mirror (`_watch`)
            self._follows_said.add(run_id)

    async def let_go(self, context_id: str, *, owner: OwnerScope) -> bool:
        """Runs execute on workers, whose end statement releases their pins: nothing to wait for."""
        return False

    async def cancel(self, run_id: str, *, wait_s: float = 5.0) -> None:
        run = self._mirrors[run_id]
        # A queued run ends here (nobody else will write its end); a running one is cancelled
        # by its worker, which the queue tells (a wake-up, and its poll).
        reason = "cancelled by the caller before a worker took it"
        await self._queue.cancel(run_id, run.record().ended("cancelled", reason))
        self._wakeups.wake(run_id)
        with anyio.move_on_after(wait_s):
            await run.done.wait()

    async def _say_if_no_worker(self, run: ActiveRun) -> None:
        """A queued run with no live worker says so (rlm_status), after the record's own notice
        (such as "queued again"), until one comes."""
        due = time.monotonic() - self._workers_seen_at >= self._settings.queue_poll_s
        if due and not await self._read_live_workers():  # the database is restarting: say nothing new
            return
        waiting = None
        if self._live_workers == 0:
            waiting = Notice(kind=NoticeKind.NO_WORKER, wait_s=self._settings.run_queue_timeout_s)
        if run.waiting != waiting:
            run.waiting = waiting
            run.notify("queued")

    async def _read_live_workers(self) -> bool:
        """Read the live workers' count, one read at a time: the runs of a burst that find the
        count due while it is being read wait for that read's answer instead of each asking (older
        than their own would be by less than one round trip). False when it failed."""
        if (reading := self._workers_reading) is not None:
            await reading.wait()
            return self._workers_read_ok
        self._workers_reading = anyio.Event()
        started = time.monotonic()
        self._workers_read_ok = False  # until it answers (a cancelled read tells its waiters nothing)
        try:
            self._live_workers = await self._queue.live_workers()
            self._workers_seen_at = started
            self._workers_read_ok = True
        except Exception:  # the caller says nothing new; the next due read tries again
            self._workers_read_ok = False
        finally:
            self._workers_reading.set()
            self._workers_reading = None
        return self._workers_read_ok

    def _carried(self, run_id: str, state: LiveSummary | RunRecord) -> bool | None:
        """A live summary or final record heard while the run's watcher waits
        (`Wakeups.on_carried`): applied to the mirror here. True (wake the watcher) when the run
        left the queue (its watcher waits for news from then on, with no timer of its own); None
        for the run's final record, or when the run has no mirror here (its watcher takes it)."""
        run = self._mirrors.get(run_id)
        if run is None or (isinstance(state, RunRecord) and state.done):
            # No mirror here, or the run's end: its watcher takes that, and applies it and retires
            # the run in one step (the finished runs' cap holds when its caller wakes).
            return None
        queued = run.progress.status == "queued"
        apply(run, state)
        return queued and run.progress.status != "queued"

    def _follow(self, run: ActiveRun, *, known: bool = False) -> None:
        """Mirror the run and watch it (its wake-ups are followed already: `Wakeups.follow`)."""
        assert self._tg is not None
        self._mirrors[run.run_id] = run
        self._tg.start_soon(functools.partial(self._watch, run, known=known))

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
        apply(run, row.summary)
        return True

    async def _watch(self, run: ActiveRun, *, known: bool = False) -> None:
        """Follow the run until it ends; `known`: the mirror already shows its row (the run was
        just queued here), so the first wake-up is awaited before anything is read."""
        live: LiveSummary | RunRecord | None = None  # what the last wake-up carried: no row to read
        look = True  # read the row (a wake-up without a summary, or nothing heard at all)
        poll = self._settings.queue_poll_s
        try:
            while not run.done.is_set():
                if known:
                    known = False
                elif live is not None:
                    apply(run, live)
                elif look and not await self._refresh(run):
                    break
                if run.progress.status == "queued" and not run.done.is_set():
                    await self._say_if_no_worker(run)
                if not run.done.is_set():
                    # A queued run looks again each poll interval (whether a worker is alive);
                    # a running one waits for news, and `Wakeups.watch_silence` wakes it when
                    # the listener heard nothing at all for an interval (announcements may be lost).
                    within = poll if run.progress.status == "queued" else math.inf
                    woken, live = await self._wakeups.wait(run.run_id, within)
                    # Nothing for this run within the poll interval: its row is read unless the
                    # listener heard other runs meanwhile (its session is alive, so this run's
                    # announcements were not lost: `Wakeups.heard_within`). A busy front's quiet
                    # runs (a sandbox starting, a long LM call, a queue wait) cost no statement.
                    look = woken or not self._wakeups.heard_within(poll)
        finally:
            self._wakeups.forget(run.run_id)
            self._follows_said.discard(run.run_id)
            self._finished.append(run.run_id)
            while len(self._finished) > FINISHED_RUNS_KEPT:
                self._mirrors.pop(self._finished.popleft(), None)
