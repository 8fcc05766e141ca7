"""`KernelSandbox`: one run's REPL, which survives the death of its sandbox, on any backend.

It talks to its kernel through a `KernelChannel` (rlm_mcp.ports.kernel) in typed frames, so the
same logic runs a Docker container today and a Kubernetes pod later (docs/architecture.md).

A cell that kills its container (timeout past the grace, OOM, kernel exit, protocol violation)
gets a fresh container with the same contexts reloaded and a `CellResult` that says so; the run
goes on. Sub-LM requests from the cell are answered concurrently through the bridge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import SandboxError
from rlm_mcp.observability import metrics
from rlm_mcp.ports import CellResult, ContextSpec, LMBridge, LMRequest
from rlm_mcp.ports.kernel import (
    ChannelEvent,
    ExecFrame,
    ExecResultFrame,
    HostFrame,
    InterruptFrame,
    KernelChannel,
    LMRequestFrame,
    LMResultFrame,
    LogFrame,
)
from rlm_mcp.sandbox.cell_clock import GRACE_S, CellClock, CellTimeout, Watchdog
from rlm_mcp.sandbox.lm_gate import LMGate
from rlm_mcp.sandbox.recovery import ContainerLost, LostCount, death, load_contexts, start_loaded

__all__ = ["ContainerLost", "KernelSandbox", "load_contexts"]

log = logging.getLogger("rlm_mcp.sandbox")

MAX_LOG_FRAMES = 100


@dataclass
class _Reading:
    """What the reading of one cell's frames found so far."""

    cell_id: int
    frame: ExecResultFrame | None = None  # the cell's result
    lost: ContainerLost | None = None  # the kernel died or broke the protocol
    pending: LMRequestFrame | None = None  # a sub-call request read before the cell had a task group
    ended: ChannelEvent | None = None  # the channel ended (eof, violation): why is asked next
    logs: int = 0

    @property
    def open(self) -> bool:
        """Whether the cell is still to be read (no result, no loss)."""
        return self.frame is None and self.lost is None and self.ended is None


class KernelSandbox:
    """Implements `rlm_mcp.ports.Sandbox` over kernel channels from any backend."""

    def __init__(
        self,
        settings: SandboxSettings,
        contexts: Sequence[ContextSpec],
        container: KernelChannel,
        replace: Callable[[], Awaitable[KernelChannel]],
        discard: Callable[[KernelChannel], Awaitable[None]],
        lost_error: Callable[[int, str], SandboxError],
    ) -> None:
        self._settings = settings
        self._contexts = list(contexts)
        self._container: KernelChannel | None = container
        self._replace = replace
        self._discard = discard
        self._gate = LMGate(settings)
        self._lock = anyio.Lock(fast_acquire=True)
        self._lost = LostCount(lost_error)

    @property
    def container(self) -> KernelChannel | None:
        return self._container

    async def execute(self, code: str, bridge: LMBridge, *, training_cell: bool = False) -> CellResult:
        async with self._lock:  # one cell at a time: the kernel is a single REPL
            note: str | None = None
            if self._container is None or self._container.eof:
                note = await self._replace_stopped()
            container = self._container
            assert container is not None
            done = False
            try:
                result = await self._run_cell(container, code, bridge, training_cell=training_cell)
                done = True
            except ContainerLost as lost:
                done = True
                return await self._recover(container, lost)
            finally:
                if not done:  # cancelled (or a bug) mid-cell: the kernel's state is unknown
                    with anyio.CancelScope(shield=True):
                        self._container = None
                        await self._discard(container)
            self._lost.in_row = 0  # the Docker connection carried a whole cell
            metrics.cell_finished(result.duration_s, result.timed_out)
            if note:
                result.restarted = True
                result.notice = note
            return result

    async def add_contexts(self, contexts: Sequence[ContextSpec]) -> None:
        """Bind more contexts after those loaded, as the next context_i (a kept session's
        follow-up). A sandbox that stopped meanwhile gets them with the others at its restart."""
        async with self._lock:
            start = len(self._contexts)
            self._contexts.extend(contexts)
            container = self._container
            if container is None or container.eof or not contexts:
                return
            try:
                await load_contexts(container, contexts, self._settings, start=start)
            except ContainerLost:
                with anyio.CancelScope(shield=True):
                    self._container = None
                    await self._discard(container)

    async def _recover(self, container: KernelChannel, lost: ContainerLost) -> CellResult:
        with anyio.CancelScope(shield=True):
            self._container = None
            await self._discard(container)
        if lost.lost:  # bounded: a daemon that stays out of reach ends the run with ConnectionLostError
            await self._lost.another(lost.reason)
        await self._restart()
        notice = (
            f"{lost.reason} The sandbox was replaced by a fresh one: all variables were lost; contexts reloaded "
            "(context, context_0, ...). Continue from there."
        )
        # The reason is said once, in the notice (the model used to read it twice).
        return CellResult(error="SandboxRestarted", restarted=True, notice=notice)

    async def _replace_stopped(self) -> str:
        """A fresh sandbox for one that ended between cells (e.g. its Docker connection dropped)."""
        stopped, self._container = self._container, None
        why = "The sandbox had stopped before this cell"
        if stopped is not None:
            lost = await death(stopped, self._settings, "eof", "it had stopped")
            with anyio.CancelScope(shield=True):
                await self._discard(stopped)
            if lost.lost:
                await self._lost.another(lost.reason)
            why = f"{lost.reason.rstrip('.')} (before this cell)"
        await self._restart()
        return f"{why}; it was replaced: all variables were lost; contexts reloaded."

    async def _restart(self) -> None:
        self._container = await start_loaded(self._replace, self._discard, self._contexts, self._settings, self._lost)

    async def close(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            with anyio.CancelScope(shield=True):
                await self._discard(container)

    # -- one cell --------------------------------------------------------------------------
    async def _run_cell(
        self, container: KernelChannel, code: str, bridge: LMBridge, *, training_cell: bool
    ) -> CellResult:
        clock = CellClock()
        state = CellTimeout()
        reading = _Reading(container.new_id())
        groups: list[anyio.abc.TaskGroup] = []  # the cell's task group, once it needs one
        quick = anyio.CancelScope()

        def expire() -> None:
            if groups:
                groups[0].start_soon(self._interrupt, container, state, groups[0].cancel_scope)
            else:
                quick.cancel()  # the task group opens and starts the interrupt

        watchdog = Watchdog(self._settings, clock, state, expire)
        try:
            await self._send(container, ExecFrame(id=reading.cell_id, code=code, training_cell=training_cell))
            # Most cells make no sub-call and end in time: their result is read without a task
            # group (entering and leaving one costs an event-loop round on every cell). The first
            # sub-call request, or the watchdog, opens one and the cell is read on inside it.
            with quick:
                await self._read(container, reading, None, clock, bridge)
            await self._why_ended(container, reading)
            if reading.open:
                async with anyio.create_task_group() as tg:
                    groups.append(tg)
                    try:
                        if state.interrupted:  # the limit passed while the cell was read without a group
                            tg.start_soon(self._interrupt, container, state, tg.cancel_scope)
                        await self._read(container, reading, tg, clock, bridge)
                        await self._why_ended(container, reading)
                    except ContainerLost as exc:
                        reading.lost = exc
                    finally:
                        watchdog.cancel()
                    if state.interrupted or self._gate.outstanding:
                        tg.cancel_scope.cancel()  # the interrupt's grace, sub-calls the cell left behind
        except ContainerLost as exc:
            reading.lost = exc
        finally:
            watchdog.cancel()
        if reading.lost is not None:
            raise reading.lost
        frame = reading.frame
        if frame is None:
            if state.killed:
                raise ContainerLost(
                    f"The cell ran past {self._limit_text(state.wall)} and did not stop when interrupted (its "
                    "process was stopped or blocked in the system, or ran code that does not return to Python, "
                    "such as a long call into C), so its sandbox was killed."
                )
            raise ContainerLost("The sandbox stopped answering.")
        return self._to_result(frame, state.interrupted, state.wall)

    async def _why_ended(self, container: KernelChannel, reading: _Reading) -> None:
        if reading.ended is not None:
            event, reading.ended = reading.ended, None
            reading.lost = await death(container, self._settings, event.kind, event.detail)

    async def _read(
        self,
        container: KernelChannel,
        reading: _Reading,
        tg: anyio.abc.TaskGroup | None,
        clock: CellClock,
        bridge: LMBridge,
    ) -> None:
        """Read the cell's frames until its result or its end; without a task group (`tg` None),
        only until its first sub-call request, which is kept in `reading` for the group."""
        if reading.pending is not None and tg is not None:
            first, reading.pending = reading.pending, None
            await self._on_lm_request(tg, container, clock, first, bridge)
        while True:
            event = await container.receive()
            if event.kind != "frame" or event.frame is None:
                reading.ended = event  # asked why by the caller, out of the scope the watchdog cancels
                return
            msg = event.frame
            if isinstance(msg, ExecResultFrame) and msg.id == reading.cell_id:
                reading.frame = msg
                return
            if isinstance(msg, LMRequestFrame):
                if tg is None:
                    reading.pending = msg
                    return
                await self._on_lm_request(tg, container, clock, msg, bridge)
            elif isinstance(msg, LogFrame):
                reading.logs += 1
                if reading.logs <= MAX_LOG_FRAMES:
                    log.debug("sandbox %s: %s", container.name, msg.message[:500])
            else:
                reading.lost = ContainerLost(f"The sandbox broke the host protocol (an unexpected {msg.type} frame).")
                return

    def _limit_text(self, wall: bool) -> str:
        if wall:
            return f"its {self._settings.cell_wall_timeout_s:g} s wall-clock ceiling (RLM_MCP_CELL_WALL_TIMEOUT_S)"
        return f"its {self._settings.cell_timeout_s:g} s limit (RLM_MCP_CELL_TIMEOUT_S)"

    def _to_result(self, frame: ExecResultFrame, interrupted: bool, wall: bool) -> CellResult:
        error = frame.error
        notice = None
        if interrupted:
            error = (
                f"TimeoutError: the cell ran longer than {self._limit_text(wall)} and was "
                "interrupted; variables set before the interruption are kept." + (f"\n{error}" if error else "")
            )
            notice = "The cell was interrupted at its time limit; stray processes it started were killed."
        return CellResult(
            stdout=frame.stdout,
            stderr=frame.stderr,
            error=error,
            answer=frame.answer,
            variables=list(frame.variables),
            trained_error=None if interrupted else frame.trained_error,
            variables_at_start=frame.variables_at_start,
            duration_s=frame.duration,
            timed_out=interrupted,
            notice=notice,
        )

    async def _send(self, container: KernelChannel, frame: HostFrame) -> None:
        try:
            await container.send(frame)
        except BrokenPipeError:
            raise await death(container, self._settings, "eof", "its input closed") from None

    async def _interrupt(self, container: KernelChannel, state: CellTimeout, scope: anyio.CancelScope) -> None:
        """The cell passed its limit: interrupt it; abandon it if it is still running after GRACE_S."""
        try:
            with anyio.move_on_after(1):
                await container.send(InterruptFrame())
        except BrokenPipeError:
            pass
        await anyio.sleep(GRACE_S)
        state.killed = True
        scope.cancel()

    async def _on_lm_request(
        self, tg: anyio.abc.TaskGroup, container: KernelChannel, clock: CellClock, msg: LMRequestFrame, bridge: LMBridge
    ) -> None:
        verdict = self._gate.admit(msg.prompts)
        if verdict is not None:  # refused: answered at once, without a task or the bridge
            await self._send(container, LMResultFrame(id=msg.id, results=verdict.results, error=verdict.error))
            return
        pauses = msg.main and not clock.paused  # the cell's own code waits, once
        if pauses:
            clock.pause()
        tg.start_soon(self._answer_lm, container, clock, msg, bridge, pauses)

    async def _answer_lm(
        self, container: KernelChannel, clock: CellClock, msg: LMRequestFrame, bridge: LMBridge, pauses: bool
    ) -> None:
        prompts = msg.prompts
        results: list[str] | None = None
        try:
            try:
                got = await bridge(LMRequest(kind=msg.kind, prompts=prompts, model=msg.model))
                if isinstance(got, list) and len(got) == len(prompts):
                    results = [r if isinstance(r, str) else str(r) for r in got]
                else:
                    results = ["Error: the sub-LM bridge returned a malformed answer."] * len(prompts)
            except Exception as exc:  # the bridge must not raise; if it does, the code sees text
                log.exception("LM bridge raised")
                results = [f"Error: {type(exc).__name__}: {exc}"] * len(prompts)
        finally:
            self._gate.release()
            if pauses:
                clock.resume()
            if results is None:  # cancelled: the cell ended; unblock a thread still waiting
                results = ["Error: the sub-LM call was cancelled (its cell ended)."] * len(prompts)
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await container.send(LMResultFrame(id=msg.id, results=results))
                except BrokenPipeError:
                    pass
