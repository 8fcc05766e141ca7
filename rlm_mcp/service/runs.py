"""Runs in flight: each one a task in the service's task group, with one owner for its
cancel scope, its run log and its pinned contexts.

`rlm_complete` and `rlm_start` both start a run here; `rlm_complete` then waits on it and
turns its events into progress notifications. A run never outlives the service: on shutdown
the task group is cancelled and every run records `cancelled`. Each run started here tells the
run-end hook (`service.run_ends`) once its final record is written, before its waiters wake.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass

import anyio
import anyio.lowlevel

from rlm_mcp.call_lines import CallLine
from rlm_mcp.config import RunSettings
from rlm_mcp.engine import RLMEngine, RunNotStarted, RunPhase, RunProgress, RunResult, RunStatus
from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.errors import BusyError, RlmMcpError
from rlm_mcp.events import ChildEnd, ChildStart, RunEnd, RunEvent, SubCalls, TurnStart
from rlm_mcp.observability import metrics, tracing
from rlm_mcp.owners import OwnerScope, sees
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.runs import Notice, NoticeKind, RunRecord, RunRequest, new_run_id
from rlm_mcp.resource_errors import unexpected_failure
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.late_start import LatePin, LateRecord
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.run_queue import owner_run_share, queue_refusal
from rlm_mcp.service.slots import SlotGate
from rlm_mcp.service.unrecordable import store_unreachable, unrecordable
from rlm_mcp.store import ContextInfo
from rlm_mcp.store.ports import ContextStorePort, RunLogPort, RunStorePort

logger = logging.getLogger("rlm_mcp.service")

FINISHED_RUNS_KEPT = 64
PRUNE_EVERY_S = 300.0

# Events after which a waiting `rlm_complete` reports progress at once.
PROGRESS_EVENTS = (TurnStart, SubCalls, ChildStart, ChildEnd, RunEnd)


# What a kept session hangs on its run's end (service/sessions.py, service/queue/sessions.py).
SessionHook = Callable[[ActiveRun], Awaitable[None]]


@dataclass(frozen=True)
class _Hooks:
    """What the caller of `start` / `adopt` hangs on one run's execution: kept with the task
    that executes it, not on the `ActiveRun` that readers see."""

    # Team mode: awaited before each LM call and each cell (on the events that precede them);
    # True stops the run at once (it is no longer this worker's: `service/queue/worker.py`).
    fence: Callable[[], Awaitable[bool]] | None = None
    # A kept session's run: the session's REPL it continues...
    repl: SessionSandbox | None = None
    # ... what to tell the session before the run's final record is written (team mode: the
    # session is free again by the time a caller sees the result) ...
    on_result: SessionHook | None = None
    # ... and once it is written.
    on_end: SessionHook | None = None
    # Whether its owner's share of the slots applies here (a team worker's runs were claimed
    # within it already).
    shared: bool = True
    # Whether this manager tells the run-end hook (runs it started; a team worker's runs are
    # told by the queue's end write, `service.queue.ends.EndReporting`).
    tells_end: bool = True
    # The contexts as the call's admission read them: given, a run that takes its slot at once
    # pins them beside its first LM call (`LatePin`) instead of before it.
    specs: Sequence[ContextSpec] | None = None
    # A run `start` accepted: its record, created beside its first LM call when it takes its slot
    # at once, else before it waits for one (`LateRecord`); None: the record exists (`adopt`).
    record: LateRecord | None = None


# How long `start` waits for a run to create its record beside its first LM call before creating
# it itself: the run's steps before that call take loop rounds, unless they wait on the LM
# endpoint (its discovery, a token count), which `start` does not wait for.
RECORD_WAIT_S = 0.05

# How long a context's deletion waits for runs that have just ended to let go of it.
RELEASE_WAIT_S = 5.0

# Loop rounds the caller woken by a run's end takes to send its answer (the MCP tool returns, the
# SDK hands the result to its writer task, which writes it): the pins' release waits that long.
ANSWER_ROUNDS = 4


async def _answer_first() -> None:
    """Let the answer go out before the run's last step, the pins' release: that is a worker-thread
    hop, and a thread woken while the answer is written competes with it for the CPU (timestamps
    on the 2-core VM: the SDK's write of the answer 0.7-3.6 ms after the tool returned, with the
    release's hop in between)."""
    for _ in range(ANSWER_ROUNDS):
        await anyio.lowlevel.checkpoint()


async def _recorded(hooks: _Hooks) -> bool:
    """Whether the run's record exists (created now if the run ended before it was)."""
    if hooks.record is None:
        return True
    try:
        await hooks.record.create()
    except Exception:
        return False
    return True


class RunManager:
    """Starts, tracks and cancels runs; owns their task group."""

    def __init__(
        self,
        settings: RunSettings,
        contexts: ContextStorePort,
        records: RunStorePort,
        *,
        owners: int,
        ends: RunEnds | None = None,
    ) -> None:
        """`owners`: how many owners share the slots (the configured tokens, `configured_owners`);
        `ends`: the run-end hook's registry, told of each run this manager started once its final
        record is written."""
        self._settings = settings
        self._ends = ends if ends is not None else RunEnds()
        self._contexts = contexts
        self._records = records
        self._runs: dict[str, ActiveRun] = {}
        self._gate = SlotGate(settings.max_runs, owner_run_share(settings, owners=owners))
        self._pruned_at = float("-inf")
        self._tg: anyio.abc.TaskGroup | None = None
        # Why runs cancelled by this process's shutdown ended (a team worker names itself).
        self.shutdown_notice = Notice(kind=NoticeKind.SHUT_DOWN)

    async def __aenter__(self) -> RunManager:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        tg, self._tg = self._tg, None
        tg.cancel_scope.cancel()  # every run records `cancelled` in its own shielded finally
        await tg.__aexit__(None, None, None)

    # Runs execute in this process: starting one needs the engine and a ready sandbox backend
    # (a team-mode front, `service.queue.front.QueueFront`, says False).
    local = True

    def get(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """The live run; None for another owner's run (as for an unknown id)."""
        run = self._runs.get(run_id)
        if run is None or not sees(owner, run.request.owner):
            return None
        return run

    async def find(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """`get`, as the run backends' common interface has it (`service.backends.RunBackend`)."""
        return self.get(run_id, owner=owner)

    async def adopt(
        self,
        run_id: str,
        request: RunRequest,
        engine: RLMEngine,
        log: RunLogPort,
        *,
        fence: Callable[[], Awaitable[bool]] | None = None,
        repl: SessionSandbox | None = None,
        on_result: SessionHook | None = None,
        on_end: SessionHook | None = None,
    ) -> ActiveRun:
        """Execute a run whose record already exists (a team-mode worker claimed it from the
        queue): the same execution as `start`, without the queue bound and the new record.
        `repl`, `on_result`, `on_end`: the run continues a kept session (service/queue/sessions.py)."""
        if self._tg is None:
            raise RuntimeError("RunManager used outside its context")
        progress = RunProgress(
            run_id=run_id, max_iterations=request.limits.max_iterations, status="queued", phase=RunPhase.QUEUED
        )
        run = ActiveRun(run_id, request, progress)
        hooks = _Hooks(fence=fence, repl=repl, on_result=on_result, on_end=on_end, shared=False, tells_end=False)
        self._runs[run_id] = run
        await self._tg.start(self._execute, run, engine, log, hooks)
        return run

    async def start(
        self,
        request: RunRequest,
        engine: RLMEngine | None,
        *,
        repl: SessionSandbox | None = None,
        on_end: SessionHook | None = None,
        contexts: Sequence[ContextSpec] | None = None,
    ) -> ActiveRun:
        """`repl` and `on_end`: the run continues a kept session (embedded mode only);
        `contexts`: the request's contexts as the call's admission read them (`LatePin`)."""
        if self._tg is None or engine is None:
            raise RuntimeError("RunManager used outside its context, or without an engine")
        # Bounded before anything is opened; runs that will take a free slot at once do not count
        # as waiting. The check and the run's place among the waiting are taken with no await in
        # between, so concurrent starts cannot all pass one check.
        waiting = [r for r in self._runs.values() if not r.slotted and not r.done.is_set()]
        mine = sum(1 for r in waiting if r.request.owner == request.owner)
        busy = queue_refusal(
            self._settings,
            queued=max(0, len(waiting) - self._gate.free),
            queued_by_owner=max(0, mine - self._gate.startable(request.owner)),
        )
        if busy is not None:
            raise busy
        run_id = new_run_id()
        progress = RunProgress(
            run_id=run_id, max_iterations=request.limits.max_iterations, status="queued", phase=RunPhase.QUEUED
        )
        run = ActiveRun(run_id, request, progress)
        self._runs[run_id] = run
        record = LateRecord(self._records, run.record())
        hooks = _Hooks(repl=repl, on_end=on_end, specs=contexts, record=record)
        await self._tg.start(self._execute, run, engine, record.log, hooks)
        # Returned once the record exists: the run id handed out always names a stored record.
        # Shielded: a caller that went away meanwhile still gets the run (and cancels it).
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(RECORD_WAIT_S):
                await record.settled.wait()
            try:
                await record.create()  # the run has not yet: before its first request after all
            except Exception:
                # Refused (a full disk): the run was never accepted, as when the record came first.
                if run.scope is not None:
                    run.scope.cancel()
                await run.done.wait()
                self._runs.pop(run_id, None)
                raise
        return run

    async def follow_progress(self, run_id: str) -> None:
        """Nothing to say: the runs here publish every progress event to their waiters at once."""

    async def let_go(self, context_id: str, *, owner: OwnerScope, wait_s: float = RELEASE_WAIT_S) -> bool:
        """Wait (up to `wait_s`) until this process's runs that have ended but still pin
        `context_id` let it go (their pins go once their answer is out); whether there were any."""
        ending = [
            r
            for r in self._runs.values()
            if r.done.is_set() and not r.released.is_set() and context_id in r.request.context_ids
        ]
        if not ending:
            return False
        with anyio.move_on_after(wait_s):
            for run in ending:
                await run.released.wait()
        return True

    async def cancel(self, run_id: str, *, wait_s: float = 5.0) -> None:
        run = self._runs[run_id]
        if run.scope is not None:
            run.scope.cancel()
        with anyio.move_on_after(wait_s):
            await run.done.wait()

    async def _execute(
        self,
        run: ActiveRun,
        engine: RLMEngine,
        log: RunLogPort,
        hooks: _Hooks,
        *,
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        try:
            await self._execute_pinned(run, engine, log, hooks, task_status)
        finally:
            run.released.set()

    async def _execute_pinned(
        self, run: ActiveRun, engine: RLMEngine, log: RunLogPort, hooks: _Hooks, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        result: RunResult | None = None
        # The contexts' pins only guard against eviction: released last, once the result is out
        # (their SQLite write was on the critical path of every run).
        async with AsyncExitStack() as pins:
            try:
                with anyio.CancelScope() as scope:
                    run.scope = scope
                    task_status.started()
                    result = await self._run_in_slot(run, engine, log, pins, hooks)
                if result is None:  # the scope was cancelled: rlm_cancel, client cancel, shutdown
                    result = self._ended(run, "cancelled", "cancelled by the caller")
            except RunNotStarted as exc:
                run.not_started = exc.cause
                result = self._ended(run, "error", str(exc.cause))
            except Exception as exc:  # a full disk, or a bug: keep the server up, say what happened
                logger.exception("run %s failed", run.run_id)
                result = self._ended(run, "error", unexpected_failure(exc))
            finally:
                with anyio.CancelScope(shield=True):
                    if result is None:  # cancelled from outside the run's own scope (shutdown)
                        result = self._ended(run, "cancelled", self.shutdown_notice.render())
                        run.notice = self.shutdown_notice
                        run.shut_down = True
                    run.result = result
                    run.progress.status = result.status
                    if not await _recorded(hooks):
                        # Its record was refused: `start` raises the store's error and forgets the
                        # run, which was never accepted (there is no end to write, count or tell).
                        metrics.run_withdrawn(started=run.began)
                        await self._ends.withdrawn(run.run_id)
                        run.done.set()
                    else:
                        metrics.run_finished(
                            result.status, result.duration_s, result.iterations, result.sub_calls, started=run.began
                        )
                        await self._end(run, log, hooks, result)

    async def _end(self, run: ActiveRun, log: RunLogPort, hooks: _Hooks, result: RunResult) -> None:
        """The run's end, once its result is known: the session's, its final record, the run-end
        hook, its waiters woken; then housekeeping, and the answer let out first."""
        if hooks.on_result is not None:
            try:
                await hooks.on_result(run)
            except Exception:
                logger.exception("the session of run %s could not record its end", run.run_id)
        final = await self._finish_record(run, log)
        if hooks.on_end is not None:
            try:
                await hooks.on_end(run)
            except Exception:
                logger.exception("the session of run %s could not take its end", run.run_id)
        if hooks.tells_end:
            await self._ends.ended(final)
        run.done.set()
        run.notify("run_end")
        self._forget_old_runs()
        await self._prune_records()
        await _answer_first()

    async def _prune_records(self) -> None:
        """Keep the records on disk bounded too (at most once every few minutes)."""
        now = time.monotonic()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        try:
            await self._records.prune(
                max_records=self._settings.run_max_records, max_age_days=self._settings.run_max_age_days
            )
        except Exception:  # housekeeping must never fail a run
            logger.exception("could not prune old run records")

    def _forget_old_runs(self) -> None:
        """Keep only the newest finished runs in memory: older ones are served from their
        records on disk, so a long-lived server does not grow with every answer it gave."""
        finished = [r for r in self._runs.values() if r.result is not None]
        for run in finished[: max(0, len(finished) - FINISHED_RUNS_KEPT)]:
            del self._runs[run.run_id]

    async def _run_in_slot(
        self, run: ActiveRun, engine: RLMEngine, log: RunLogPort, pins: AsyncExitStack, hooks: _Hooks
    ) -> RunResult | None:
        """Pin the contexts (onto `pins`, which the caller releases) and run once a slot is free.
        None: the run's record was refused (`start` raises the store's error)."""
        request = run.request

        def enter() -> AbstractAsyncContextManager[list[ContextInfo]]:
            return self._contexts.in_use(request.context_ids, owner=request.owner)

        late: LatePin | None = None
        ready: Callable[[], Awaitable[None]] | None = None
        if hooks.specs is not None and self._gate.try_acquire(request.owner, run, shared=hooks.shared):
            run.notify("queued")  # as `_acquire_slot` says it
            # The record and the pins beside the first LM call: the engine's `ready` step.
            specs, late, record = list(hooks.specs), LatePin(pins, enter), hooks.record

            async def ready() -> None:
                if record is not None:
                    await record.create()
                await late.get()

        else:
            if not await _recorded(hooks):  # before it waits: a queued run is listed from its record
                return None
            # Pinned while queued too: eviction (here or in another process) must not take the
            # contexts while the run waits for a slot.
            try:
                infos = await pins.enter_async_context(enter())
            except RlmMcpError as exc:  # a context deleted since the call was checked
                raise RunNotStarted(exc) from exc
            await self._acquire_slot(run, hooks)
            specs = [self._contexts.spec(info) for info in infos]
        try:
            return await self._run_pinned(run, engine, log, specs, hooks, late=late, ready=ready)
        finally:
            self._gate.release(request.owner)

    async def _acquire_slot(self, run: ActiveRun, hooks: _Hooks) -> None:
        timeout = self._settings.run_queue_timeout_s
        owner = run.request.owner
        run.notify("queued")
        with anyio.move_on_after(timeout) as waited:
            await self._gate.acquire(owner, run, shared=hooks.shared)
        if not waited.cancelled_caught:
            return
        gate = self._gate
        if gate.running(owner) >= gate.share:  # it waited for its owner's runs, not for the server
            raise RunNotStarted(
                BusyError(
                    f"You already have {gate.running(owner)} runs executing (your share of the server's "
                    f"{gate.slots} slots, RLM_MCP_MAX_RUNS_PER_OWNER={gate.share}) and none of them finished "
                    f"within {timeout:.0f} s.",
                    "Wait for one of your runs to end (rlm_status) or cancel one (rlm_cancel).",
                )
            )
        raise RunNotStarted(
            BusyError(
                f"{gate.slots} runs are already executing and none finished within {timeout:.0f} s.",
                "Wait for a run to end (rlm_status), cancel one (rlm_cancel), or raise RLM_MCP_MAX_RUNS.",
            )
        )

    async def _run_pinned(
        self,
        run: ActiveRun,
        engine: RLMEngine,
        log: RunLogPort,
        specs: list[ContextSpec],
        hooks: _Hooks,
        *,
        late: LatePin | None,
        ready: Callable[[], Awaitable[None]] | None,
    ) -> RunResult:
        """`late`: the contexts' pins when they go beside the first LM call, in the engine's
        `ready` step (None: pinned already)."""
        run.progress.status = "running"
        run.progress.phase = RunPhase.STARTING
        run.progress.started = time.monotonic()
        run.began = True
        metrics.run_started()
        try:
            await log.open()  # only now: a queued run holds no descriptor
        except Exception:  # a full disk must not end the run (appends try again)
            logger.exception("could not open the log of run %s", run.run_id)

        async def emit(event: RunEvent) -> None:
            try:
                await log.append(event)
            except Exception:  # a full disk must not end the run
                logger.exception("could not append to the log of run %s", run.run_id)
            if isinstance(event, PROGRESS_EVENTS):
                run.notify(event.type)
            if hooks.fence is not None and run.scope is not None and await hooks.fence():
                run.scope.cancel()  # before the LM call or the cell the event announces
                await anyio.lowlevel.checkpoint()

        async def emit_call(call: CallLine) -> None:
            # An LM call's event (never a progress event), taken as `emit` takes any other.
            try:
                await log.append_call(call)
            except Exception:  # a full disk must not end the run
                logger.exception("could not append to the log of run %s", run.run_id)
            if hooks.fence is not None and run.scope is not None and await hooks.fence():
                run.scope.cancel()
                await anyio.lowlevel.checkpoint()

        with tracing.run_span(run.request.trace_context, {"rlm.run.id": run.run_id, "rlm.run.depth": 0}) as span:
            try:
                result = await engine.run(
                    run_id=run.run_id,
                    query=run.request.query,
                    contexts=specs,
                    limits=run.request.limits,
                    progress=run.progress,
                    emit=emit,
                    emit_call=emit_call,
                    session=hooks.repl,
                    ready=ready,
                )
            except RunNotStarted:
                if late is not None:
                    await late.check()  # the pin's failure comes first, as when it came before the run
                raise
            if late is not None:
                await late.check()
            tracing.run_span_done(span, result.status, result.iterations, result.sub_calls, result.usage.total)
            return result

    def _ended(self, run: ActiveRun, status: RunStatus, reason: str) -> RunResult:
        result = run.record().ended(status, reason).result
        assert result is not None
        return result

    async def _finish_record(self, run: ActiveRun, log: RunLogPort) -> RunRecord:
        """Write the run's final record; returns it (the `error` record that replaced it, when
        the store refused it for what it holds)."""
        final = run.record()
        try:
            try:
                await log.write_summary(final)
            except Exception as exc:
                if store_unreachable(exc):
                    raise
                # Refused for what it holds (it would be refused again): recorded `error`, saying why, and the
                # caller is told the same (service/unrecordable.py).
                logger.exception("the store refused the record of run %s; recording it `error`", run.run_id)
                ended = unrecordable(final, exc)
                run.result, run.notice, run.progress.status = ended.result, ended.notice, "error"
                final = run.record()
                await log.write_summary(final)
            await log.aclose()
        except Exception:
            logger.exception("could not write the record of run %s", final.run_id)
        return final
