"""One root turn: fit the window, call the root model, run its repl blocks, record the turn."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from rlm_mcp.config import EngineSettings
from rlm_mcp.engine import messages as msg
from rlm_mcp.engine.answer import AnswerState
from rlm_mcp.engine.formatting import cap_messages, cap_text, format_outputs
from rlm_mcp.engine.opening import SandboxOpener
from rlm_mcp.engine.parsing import find_legacy_final, find_repl_blocks, has_unclosed_repl_block
from rlm_mcp.engine.profiles import PromptProfile
from rlm_mcp.engine.tree import RunTree, Where
from rlm_mcp.engine.types import RunLimits, RunPhase, RunProgress, RunStatus
from rlm_mcp.engine.window import WindowTooSmallError, fit_history
from rlm_mcp.events import Cell, CellStart, ChatMessage, HistoryElided, Turn, TurnStart
from rlm_mcp.observability import tracing
from rlm_mcp.ports import CellResult, ChatModel, LMBridge, Sandbox
from rlm_mcp.ports.chat import (
    DEFAULT_WINDOW,
    CallRecord,
    Completion,
    LMConnectionError,
    LMContextLengthError,
    LMError,
    LMModelNotFoundError,
)

log = logging.getLogger("rlm_mcp.engine")

RESTART_NOTICE = (
    "The REPL was restarted: every variable from earlier cells is gone (the contexts were "
    "loaded again). Recreate what you still need."
)


class StopRun(Exception):
    """Ends the loop with a status and reason (raised from deep inside a turn)."""

    def __init__(self, status: RunStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class RunContext:
    """Per-run state shared by the loop and its turns."""

    settings: EngineSettings
    lm: ChatModel
    tree: RunTree
    depth: int
    run_id: str
    progress: RunProgress
    limits: RunLimits
    history: msg.History = field(default_factory=msg.History)
    answer: AnswerState = field(default_factory=AnswerState)
    window: int = DEFAULT_WINDOW  # replaced by the model's real window before the first turn
    iterations: int = 0
    root_calls: int = 0
    consecutive_errors: int = 0

    @property
    def started(self) -> bool:
        """Whether the run has started as its caller sees it: once the root model replied.
        Before that a failure is the caller's error, raised as `RunNotStarted`; after it, a
        structured result. A child is always started: its parent is already running."""
        return self.depth > 0 or self.root_calls > 0


class TurnRunner:
    def __init__(
        self, ctx: RunContext, opener: SandboxOpener, bridge: LMBridge, *, context_count: int, profile: PromptProfile
    ) -> None:
        """`opener`: the run's sandbox, still opening while the first root call is in flight;
        the first reply is taken once it is open (engine/opening.py)."""
        self.ctx = ctx
        self.profile = profile
        self.opener = opener
        self._sandbox: Sandbox | None = None
        self.bridge = bridge
        self.context_count = context_count
        # Shown once, with the run's first REPL output (a kept session restored with names lost).
        self.pending_notice: str | None = None

    async def sandbox(self) -> Sandbox:
        """The run's sandbox, waiting for it to open the first time (the phase says so meanwhile)."""
        if self._sandbox is None:
            if self.ctx.depth == 0 and not self.opener.done:
                self.ctx.progress.phase = RunPhase.SANDBOX
            opened = await self.opener.get()
            if opened.restored_lost:
                self.pending_notice = msg.restored_lost_note(opened.restored_lost)
            if opened.note:
                self.pending_notice = opened.note
            self._sandbox = opened.sandbox
        return self._sandbox

    async def turn(self, iteration: int, turn_text: str) -> tuple[RunStatus, str | None] | None:
        """Play one turn; return (status, reason) when the run must end, else None."""
        with tracing.span("rlm.turn", {"rlm.turn": iteration, "rlm.depth": self.ctx.depth}) as span:
            outcome = await self._turn(iteration, turn_text)
            if outcome is not None:
                span.set_attribute("rlm.run.status", outcome[0])
            return outcome

    async def _turn(self, iteration: int, turn_text: str) -> tuple[RunStatus, str | None] | None:
        ctx = self.ctx
        if ctx.tree.over_budget():
            # Siblings share the tree's budget: a child must not make its first (or next) root
            # call once another run of the tree has spent it.
            return "budget_exceeded", self._budget_reason()
        ctx.iterations = iteration
        if ctx.depth == 0:
            ctx.progress.iterations = iteration
        await ctx.tree.emit(
            TurnStart(run_id=ctx.run_id, iteration=iteration, max_iterations=ctx.limits.max_iterations, depth=ctx.depth)
        )
        # Turn 1 also logs the system and metadata messages, so a run's log holds the whole
        # conversation (the trajectory export and viewer rebuild it from these events).
        first_new = 0 if iteration == 1 else len(ctx.history)
        ctx.history.add("user", turn_text, "turn", iteration)
        completion = await self._root_call()
        ctx.history.add("assistant", completion.text, "assistant", iteration)
        if ctx.tree.over_budget():
            await self._emit_turn(iteration, first_new)
            return "budget_exceeded", self._budget_reason()

        outcome = await self._run_blocks(iteration, completion)
        await self._emit_turn(iteration, first_new)
        if ctx.answer.ready:
            return "completed", None
        if outcome is not None:
            return outcome
        if ctx.tree.over_budget():
            return "budget_exceeded", self._budget_reason()
        return None

    # -- the root call ------------------------------------------------------------------------
    async def _root_call(self) -> Completion:
        ctx = self.ctx
        settings = ctx.settings
        model = settings.model
        floor = settings.min_completion_tokens
        max_tokens = await self._fit(settings.root_max_tokens, ctx.window)
        for attempt in (1, 2):
            if ctx.depth == 0:
                ctx.progress.phase = RunPhase.LM
            started = time.monotonic()
            # The sandbox opens once the first request is on its way (engine/opening.py): the
            # opener's task is woken now and runs at this call's first yield, behind the request.
            self.opener.release()
            try:
                completion = await ctx.lm.complete(
                    ctx.history.snapshot(), model=model, max_tokens=max_tokens, role="root", session=ctx.run_id
                )
            except LMContextLengthError as exc:
                self._account_failure(exc)
                await self._emit_call(model, None, time.monotonic() - started, str(exc), failed=exc.record)
                if attempt == 2:
                    said = getattr(exc, "server_message", None) or str(exc)
                    raise StopRun(
                        "error", f"the LM server rejected the conversation as too long twice: {said}"
                    ) from None
                # Our count disagreed with the server's: elide harder for the retry, and trust
                # the window a little less for the rest of the run so this does not recur.
                log.warning("root call rejected for length (%s); shrinking and retrying once", exc)
                max_tokens = await self._fit(max(floor, max_tokens // 2), int(ctx.window * 0.75))
                ctx.window = int(ctx.window * 0.9)
                continue
            except LMError as exc:
                self._account_failure(exc)
                await self._emit_call(model, None, time.monotonic() - started, str(exc), failed=exc.record)
                # Endpoint down or model unknown at the first call: the caller's setup is
                # wrong, so it is theirs to fix (the loop raises it as RunNotStarted).
                if not ctx.started and isinstance(exc, (LMConnectionError, LMModelNotFoundError)):
                    raise
                where = f" at {exc.endpoint}" if exc.endpoint else ""
                raise StopRun("error", f"root LM call{where} failed: {exc}") from None
            if ctx.root_calls == 0:
                # The first reply counts (and the run has started) only once the sandbox it will
                # run in is open; a sandbox that cannot open raises here, the reply unused.
                await self.sandbox()
            ctx.root_calls += 1
            ctx.tree.record(completion.record)
            await self._emit_call(model, completion, time.monotonic() - started, None)
            return completion
        raise AssertionError("unreachable")

    def _account_failure(self, exc: LMError) -> None:
        # The LM client attaches the failed call's record (status "error"): it counts as a call.
        if exc.record is not None:
            self.ctx.tree.record(exc.record)

    async def _fit(self, max_tokens: int, window: int) -> int:
        ctx = self.ctx
        try:
            fit = await fit_history(
                ctx.history,
                ctx.lm,
                model=ctx.settings.model,
                window=window,
                max_tokens=max_tokens,
                floor=ctx.settings.min_completion_tokens,
            )
        except WindowTooSmallError as exc:
            raise StopRun("error", f"context window too small: {exc}") from None
        if fit.elided or fit.cut_newest:
            if ctx.depth == 0:
                ctx.progress.elided_messages = ctx.history.elided_count
            await ctx.tree.emit(
                HistoryElided(
                    run_id=ctx.run_id,
                    depth=ctx.depth,
                    indices=fit.elided,
                    cut_newest=fit.cut_newest,
                    tokens_before=fit.tokens_before,
                    tokens_after=fit.prompt_tokens,
                    window=window,
                    max_tokens=fit.max_tokens,
                )
            )
        return fit.max_tokens

    # -- running the reply --------------------------------------------------------------------
    async def _run_blocks(self, iteration: int, completion: Completion) -> tuple[RunStatus, str | None] | None:
        ctx = self.ctx
        text = completion.text
        blocks = find_repl_blocks(text)
        cut_off = completion.finish_reason == "length" and has_unclosed_repl_block(text)
        outputs: list[str] = []
        outcome: tuple[RunStatus, str | None] | None = None
        for index, code in enumerate(blocks, start=1):
            result, output = await self._execute(iteration, index, code)
            outputs.append(output)
            if result.error:
                ctx.consecutive_errors += 1
            else:
                ctx.consecutive_errors = 0
            if ctx.answer.observe(result.answer):
                break
            if ctx.consecutive_errors >= ctx.limits.max_errors:
                outcome = ("error", f"max_errors: {ctx.consecutive_errors} consecutive cells raised an exception")
                break
            if ctx.tree.over_budget():
                break
        notes: list[str] = []
        if not ctx.answer.ready and outcome is None:
            legacy = find_legacy_final(text)
            if legacy is not None and legacy.kind == "text" and blocks:
                # Prose written in the same reply as code was written before that code ran: an
                # answer there may rest on invented output (reference PR #127). Not accepted.
                notes.append(msg.PROSE_FINAL_REFUSED)
            elif legacy is not None and legacy.kind == "text":
                ctx.answer.submit_text(legacy.value)
            elif legacy is not None:
                note = await self._final_var(iteration, legacy.value)
                if note:
                    notes.append(note)
        if cut_off:
            notes.append(msg.cut_off_message(ctx.settings.root_max_tokens))
        output_chars = ctx.settings.output_chars
        if outputs:
            content = format_outputs(outputs, output_chars)
            if notes:
                content += "\n\n" + "\n\n".join(notes)
            ctx.history.add("user", content, "output", iteration)
        elif notes:
            ctx.history.add("user", "\n\n".join(notes), "notice", iteration)
        return outcome

    async def _execute(self, iteration: int, index: int, code: str) -> tuple[CellResult, str]:
        """Run one block; its result and its output as the model will read it (formatted once:
        the `cell` event and the next message carry the same text)."""
        ctx = self.ctx
        if ctx.depth == 0:
            ctx.progress.phase = RunPhase.CELL
        started = time.monotonic()
        await ctx.tree.emit(CellStart(run_id=ctx.run_id, iteration=iteration, block=index, depth=ctx.depth))
        ctx.tree.open_cells[ctx.run_id] = (iteration, index)
        try:
            with tracing.span(
                "rlm.cell", {"rlm.turn": iteration, "rlm.cell.block": index, "rlm.depth": ctx.depth}
            ) as span:
                sandbox = await self.sandbox()
                result = await sandbox.execute(code, self.bridge, training_cell=self.profile.training_cell)
                tracing.cell_done(span, error=result.error, timed_out=result.timed_out, restarted=result.restarted)
        finally:
            ctx.tree.open_cells.pop(ctx.run_id, None)
        if result.restarted and not result.notice:
            result.notice = RESTART_NOTICE
        if self.pending_notice:
            result.notice = f"{result.notice}\n{self.pending_notice}" if result.notice else self.pending_notice
            self.pending_notice = None
        output = self.profile.format_cell(result)
        await ctx.tree.emit(
            Cell(
                run_id=ctx.run_id,
                iteration=iteration,
                block=index,
                code=cap_text(code),
                output=cap_text(output),
                duration_s=round(result.duration_s or (time.monotonic() - started), 4),
                error=result.error,
                timed_out=result.timed_out,
                restarted=result.restarted,
                depth=ctx.depth,
            )
        )
        return result, output

    async def _final_var(self, iteration: int, name: str) -> str | None:
        """Resolve FINAL_VAR(name) by having the sandbox set the answer from that variable."""
        code = f'answer["content"] = {name}\nanswer["ready"] = True'
        result, _ = await self._execute(iteration, 0, code)
        if result.error or not self.ctx.answer.observe(result.answer):
            return f"FINAL_VAR({name}) was not accepted: there is no variable named {name} in the REPL."
        return None

    # -- events -------------------------------------------------------------------------------
    async def _emit_turn(self, iteration: int, first_new: int) -> None:
        ctx = self.ctx
        await ctx.tree.emit(
            Turn(
                run_id=ctx.run_id,
                iteration=iteration,
                depth=ctx.depth,
                new_messages=[ChatMessage(**m) for m in cap_messages(ctx.history.messages[first_new:])],
            )
        )

    async def _emit_call(
        self,
        model: str,
        completion: Completion | None,
        latency: float,
        error: str | None,
        *,
        failed: CallRecord | None = None,
    ) -> None:
        ctx = self.ctx
        await ctx.tree.emit_call(
            role="root",
            run_id=ctx.run_id,
            model=model,
            completion=completion,
            latency_s=latency,
            error=error,
            depth=ctx.depth,
            where=Where(iteration=ctx.iterations),
            failed=failed,
        )

    def _budget_reason(self) -> str:
        tree = self.ctx.tree
        return f"token_budget={tree.limits.token_budget} exceeded ({tree.usage.total.total} tokens used)"


__all__ = ["RESTART_NOTICE", "RunContext", "StopRun", "TurnRunner"]
