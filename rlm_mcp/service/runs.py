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
from dataclasses import replace

import anyio
import anyio.lowlevel

from rlm_mcp.config import RunSettings
from rlm_mcp.engine import RLMEngine, RunNotStarted, RunPhase, RunProgress, RunResult
from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.errors import BusyError, RlmMcpError
from rlm_mcp.observability import metrics
from rlm_mcp.owners import OwnerScope, sees
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.runs import Notice, NoticeKind, RunRequest, new_run_id
from rlm_mcp.resource_errors import unexpected_failure
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.late_start import LatePin, LateRecord
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.run_execution import (
    ADOPTED,
    RunHooks,
    SessionHook,
    answer_first,
    ended_result,
    execute_pinned,
    finish_record,
    recorded,
)
from rlm_mcp.service.run_queue import owner_run_share, queue_refusal
from rlm_mcp.service.slots import Place, SlotGate
from rlm_mcp.store import ContextInfo
from rlm_mcp.store.context_model import HeldPins
from rlm_mcp.store.ports import ContextStorePort, RunLogPort, RunStorePort

logger = logging.getLogger("rlm_mcp.service")

FINISHED_RUNS_KEPT = 64
PRUNE_EVERY_S = 300.0

# How long `start` waits for a run to create its record beside its first LM call before creating
# it itself: the run's steps before that call take loop rounds, unless they wait on the LM
# endpoint (its discovery, a token count), which `start` does not wait for.
RECORD_WAIT_S = 0.05

# How long a context's deletion waits for runs that have just ended to let go of it.
RELEASE_WAIT_S = 5.0


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
        pins: HeldPins | None = None,
    ) -> ActiveRun:
        """Execute a run whose record already exists (a team-mode worker claimed it from the
        queue): the same execution as `start`, without the queue bound and the new record.
        `repl`, `on_result`, `on_end`: the run continues a kept session (service/queue/sessions.py).
        `pins`: its contexts, already pinned by its claim (released at its end as its own are)."""
        if self._tg is None:
            raise RuntimeError("RunManager used outside its context")
        progress = RunProgress(
            run_id=run_id, max_iterations=request.limits.max_iterations, status="queued", phase=RunPhase.QUEUED
        )
        if pins is not None:
            pins.hand_over()  # released by `_execute`'s end from here on, whatever happens
        run = ActiveRun(run_id, request, progress, pins=pins if pins is not None else HeldPins())
        hooks = replace(ADOPTED, fence=fence, repl=repl, on_result=on_result, on_end=on_end)
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
        hooks = RunHooks(repl=repl, on_end=on_end, specs=contexts, record=record)
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

    async def release_pins(self, pins: HeldPins) -> None:
        """Let go of a claimed run's pins when it is not adopted after all (it could not start)."""
        await self._contexts.release(pins)

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
        hooks: RunHooks,
        *,
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        try:
            await self._execute_pinned(run, engine, log, hooks, task_status)
        finally:
            await self._contexts.release(run.pins)  # pinned by its claim, never taken over (no start)
            run.released.set()

    async def _execute_pinned(
        self,
        run: ActiveRun,
        engine: RLMEngine,
        log: RunLogPort,
        hooks: RunHooks,
        task_status: anyio.abc.TaskStatus[None],
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
                    result = ended_result(run, "cancelled", "cancelled by the caller")
            except RunNotStarted as exc:
                run.not_started = exc.cause
                result = ended_result(run, "error", str(exc.cause))
            except Exception as exc:  # a full disk, or a bug: keep the server up, say what happened
                logger.exception("run %s failed", run.run_id)
                result = ended_result(run, "error", unexpected_failure(exc))
            finally:
                with anyio.CancelScope(shield=True):
                    if result is None:  # cancelled from outside the run's own scope (shutdown)
                        result = ended_result(run, "cancelled", self.shutdown_notice.render())
                        run.notice = self.shutdown_notice
                        run.shut_down = True
                    run.result = result
                    run.progress.status = result.status
                    if not await recorded(hooks):
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

    async def _end(self, run: ActiveRun, log: RunLogPort, hooks: RunHooks, result: RunResult) -> None:
        """The run's end, once its result is known: the session's, its final record, the run-end
        hook, its waiters woken; then housekeeping, and the answer let out first (when it goes out
        from this process)."""
        if hooks.on_result is not None:
            try:
                await hooks.on_result(run)
            except Exception:
                logger.exception("the session of run %s could not record its end", run.run_id)
        final = await finish_record(run, log)
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
        if hooks.answered_here:
            await answer_first()

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
        self, run: ActiveRun, engine: RLMEngine, log: RunLogPort, pins: AsyncExitStack, hooks: RunHooks
    ) -> RunResult | None:
        """Pin the contexts (onto `pins`, which the caller releases) and run once a slot is free.
        None: the run's record was refused (`start` raises the store's error)."""
        request = run.request

        def enter() -> AbstractAsyncContextManager[list[ContextInfo]]:
            return self._contexts.in_use(request.context_ids, owner=request.owner, held=run.pins)

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
            # Its place in the slots' line is taken now, before the awaits below (its record, its
            # pins): waiting runs take the slots in the order they were started.
            place = self._gate.line_up(request.owner, run, shared=hooks.shared)
            try:
                if not await recorded(hooks):  # before it waits: a queued run is listed from its record
                    place.leave()
                    return None
                # Pinned while queued too: eviction (here or in another process) must not take the
                # contexts while the run waits for a slot.
                try:
                    infos = await pins.enter_async_context(enter())
                except RlmMcpError as exc:  # a context deleted since the call was checked
                    raise RunNotStarted(exc) from exc
                await self._acquire_slot(run, place)
            except BaseException:
                place.leave()  # out of the line, or the slot it was handed passed on
                raise
            specs = [self._contexts.spec(info) for info in infos]
        try:
            return await execute_pinned(run, engine, log, specs, hooks, late=late, ready=ready)
        finally:
            self._gate.release(request.owner)

    async def _acquire_slot(self, run: ActiveRun, place: Place) -> None:
        """Wait for the run's slot (its `place` in the line), at most RLM_MCP_RUN_QUEUE_TIMEOUT_S."""
        timeout = self._settings.run_queue_timeout_s
        owner = run.request.owner
        run.notify("queued")
        with anyio.move_on_after(timeout) as waited:
            await place.wait()
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
