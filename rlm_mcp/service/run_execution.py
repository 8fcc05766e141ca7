"""One run's execution inside `service.runs.RunManager`: what the caller hangs on it (`RunHooks`),
the engine run with its events written, fenced and announced (`execute_pinned`), its final record
(`finish_record`), and the answer let out before the last step (`answer_first`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
import anyio.lowlevel

from rlm_mcp.call_lines import CallLine
from rlm_mcp.engine import RLMEngine, RunNotStarted, RunPhase, RunResult, RunStatus
from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.events import ChildEnd, ChildStart, RunEnd, RunEvent, SubCalls, TurnStart
from rlm_mcp.observability import metrics, tracing
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.late_start import LatePin, LateRecord
from rlm_mcp.service.unrecordable import store_unreachable, unrecordable
from rlm_mcp.store.ports import RunLogPort

logger = logging.getLogger("rlm_mcp.service")

# Events after which a waiting `rlm_complete` reports progress at once.
PROGRESS_EVENTS = (TurnStart, SubCalls, ChildStart, ChildEnd, RunEnd)


# What a kept session hangs on its run's end (service/sessions.py, service/queue/sessions.py).
SessionHook = Callable[[ActiveRun], Awaitable[None]]


@dataclass(frozen=True)
class RunHooks:
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
    # Whether the run's answer goes out from this process (a caller here waits for it): its last
    # step, the pins' release, then lets the answer go first (`answer_first`). A team worker's
    # runs are answered by a front elsewhere, and their final write releases the pins itself.
    answered_here: bool = True
    # The contexts as the call's admission read them: given, a run that takes its slot at once
    # pins them beside its first LM call (`LatePin`) instead of before it.
    specs: Sequence[ContextSpec] | None = None
    # A run `start` accepted: its record, created beside its first LM call when it takes its slot
    # at once, else before it waits for one (`LateRecord`); None: the record exists (`adopt`).
    record: LateRecord | None = None


# What `RunManager.adopt` hangs on a team worker's run, before the run's own hooks.
ADOPTED = RunHooks(shared=False, tells_end=False, answered_here=False)


# Loop rounds the caller woken by a run's end takes to send its answer (the MCP tool returns, the
# SDK hands the result to its writer task, which writes it): the pins' release waits that long.
ANSWER_ROUNDS = 4


async def answer_first() -> None:
    """Let the answer go out before the run's last step, the pins' release: that is a worker-thread
    hop, and a thread woken while the answer is written competes with it for the CPU (timestamps
    on the 2-core VM: the SDK's write of the answer 0.7-3.6 ms after the tool returned, with the
    release's hop in between)."""
    for _ in range(ANSWER_ROUNDS):
        await anyio.lowlevel.checkpoint()


async def recorded(hooks: RunHooks) -> bool:
    """Whether the run's record exists (created now if the run ended before it was)."""
    if hooks.record is None:
        return True
    try:
        await hooks.record.create()
    except Exception:
        return False
    return True


async def execute_pinned(
    run: ActiveRun,
    engine: RLMEngine,
    log: RunLogPort,
    specs: list[ContextSpec],
    hooks: RunHooks,
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


def ended_result(run: ActiveRun, status: RunStatus, reason: str) -> RunResult:
    result = run.record().ended(status, reason).result
    assert result is not None
    return result


async def finish_record(run: ActiveRun, log: RunLogPort) -> RunRecord:
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
