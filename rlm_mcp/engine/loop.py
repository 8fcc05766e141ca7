"""The RLM loop: one root conversation driving one sandbox, with limits, recursion and events.

Choices worth knowing:
- All complete ```repl blocks of a reply run in order in the same sandbox, but the reply stops
  at the first block after which `answer` is ready (the answer is then final, so later blocks
  could only spend time and sub-calls; the reference also returns the first ready answer).
- A reply without a repl block gets no extra message: the next `Turn k/N:` follows, as in the
  reference. A reply cut off (finish_reason "length") inside a ```repl fence runs only its
  complete blocks, and the model is told its reply was cut and to send shorter code.
- Legacy `FINAL(text)` / `FINAL_VAR(name)` outside code fences end the run too (checked after
  the blocks ran, only when the answer dict is not ready), except `FINAL(text)` in a reply that
  also has a repl block: it was written before the code ran (reference PR #127), so the model is
  told it was not accepted. `FINAL_VAR(name)` reads the variable after the blocks ran: accepted.
- A child (`rlm_query` when depth + 1 < max_depth) gets the prompt as its context and no query,
  exactly as the reference starts children; it shares the tree's deadline, budget and usage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack

import anyio

from rlm_mcp.config import EngineSettings
from rlm_mcp.engine import messages as msg
from rlm_mcp.engine.bridge import make_bridge
from rlm_mcp.engine.children import child_runner
from rlm_mcp.engine.opening import SandboxOpener
from rlm_mcp.engine.profiles import PromptProfile
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.engine.session import (
    ONE_RUN,
    Opening,
    SandboxSource,
    SessionSandbox,
    no_bridge,
    store_history_code,
)
from rlm_mcp.engine.snapshot import snapshot_chunk
from rlm_mcp.engine.tree import RunTree, usage_record
from rlm_mcp.engine.turn import RunContext, StopRun, TurnRunner
from rlm_mcp.engine.types import (
    CallSink,
    EventSink,
    RunLimits,
    RunNotStarted,
    RunPhase,
    RunProgress,
    RunResult,
    RunStatus,
)
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import ContextRecord, LimitsRecord, RunEnd, RunStart
from rlm_mcp.ports import ChatModel, ContextSpec, LMBridge, Sandbox, SandboxFactory
from rlm_mcp.resource_errors import unexpected_failure

log = logging.getLogger("rlm_mcp.engine")

_CLEANUP_GRACE_S = 30.0


class RLMEngine:
    """Runs RLM trees against a chat model and a sandbox factory (both injected)."""

    def __init__(
        self,
        settings: EngineSettings,
        lm: ChatModel,
        sandboxes: SandboxFactory,
        *,
        profile: PromptProfile | None = None,
        system_prompt: str | None = None,
    ) -> None:
        """`profile` writes every text of the conversation; `system_prompt` alone means the
        rlm-mcp texts with that system prompt."""
        self.settings = settings
        self.lm = lm
        self.sandboxes = sandboxes
        if profile is None:
            profile = PromptProfile(system_prompt if system_prompt is not None else RLM_MCP_SYSTEM_PROMPT)
        self.profile = profile

    async def run(
        self,
        *,
        run_id: str,
        query: str,
        contexts: Sequence[ContextSpec],
        limits: RunLimits,
        progress: RunProgress,
        emit: EventSink,
        session: SessionSandbox | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
        emit_call: CallSink | None = None,
    ) -> RunResult:
        """Run one RLM tree to its end; always a structured result, except that cancellation
        propagates and a failure before the root model's first reply raises `RunNotStarted`.

        `session`: the run belongs to a kept session (engine/session.py): its REPL is reused when
        live (this run's contexts become the next context_i), else opened and kept for the next.
        `ready`: awaited before the run's sandbox opens, beside the first root call (the service
        pins the contexts there); it fails the run as a sandbox that cannot open does.
        `emit_call`: where each LM call's `llm_call` event goes as its log line's values (see
        `RunTree.call_sink`); without it, `emit` gets the event like every other."""
        tree = RunTree(
            progress=progress,
            limits=limits,
            deadline=anyio.current_time() + limits.timeout_s,
            sink=emit,
            call_sink=emit_call,
            max_sub_calls=self.settings.max_sub_calls_per_run,
            max_prompts_per_batch=self.settings.max_prompts_per_batch,
            max_concurrent_children=self.settings.max_concurrent_children,
        )
        return await self._run(
            tree,
            depth=0,
            run_id=run_id,
            query=query,
            contexts=contexts,
            progress=progress,
            session=session,
            ready=ready,
        )

    async def _run(
        self,
        tree: RunTree,
        *,
        depth: int,
        run_id: str,
        query: str | None,
        contexts: Sequence[ContextSpec],
        progress: RunProgress,
        session: SessionSandbox | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> RunResult:
        limits = tree.limits
        started = time.monotonic()
        ctx = RunContext(
            settings=self.settings,
            lm=self.lm,
            tree=tree,
            depth=depth,
            run_id=run_id,
            progress=progress,
            limits=limits,
        )
        status: RunStatus = "error"
        reason: str | None = None
        await tree.emit(self._run_start(run_id, depth, query, contexts, limits))
        stack = AsyncExitStack()
        try:
            with anyio.CancelScope(deadline=tree.deadline) as scope:
                try:
                    progress.phase = RunPhase.SANDBOX
                    status, reason = await self._open_and_loop(ctx, stack, query, contexts, session, ready)
                except StopRun as stop:
                    status, reason = stop.status, stop.reason
            if scope.cancelled_caught:
                status, reason = "timeout", f"timeout_s={limits.timeout_s:g} reached"
        except anyio.get_cancelled_exc_class():
            status, reason = "cancelled", "the run was cancelled"
            raise
        except RlmMcpError as exc:
            status, reason = "error", str(exc)
            if not ctx.started:
                raise RunNotStarted(exc) from exc
        except Exception as exc:
            log.exception("run %s failed", run_id)
            status, reason = "error", unexpected_failure(exc)  # a full disk is said with its fix
        finally:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(_CLEANUP_GRACE_S):
                    try:
                        await stack.aclose()
                    except Exception:
                        log.exception("closing the sandbox of run %s failed", run_id)
                progress.status = status
                progress.phase = RunPhase.DONE
                duration = time.monotonic() - started
                await tree.emit(
                    RunEnd(
                        run_id=run_id,
                        status=status,
                        reason=reason,
                        iterations=ctx.iterations,
                        usage=usage_record(tree.usage),
                        duration_s=round(duration, 4),
                        depth=depth,
                    )
                )
        return RunResult(
            status=status,
            answer=ctx.answer.content,
            reason=reason,
            run_id=run_id,
            iterations=ctx.iterations,
            usage=usage_record(tree.usage),
            duration_s=round(duration, 4),
            sub_calls=tree.progress.sub_calls,
        )

    def _run_start(
        self, run_id: str, depth: int, query: str | None, contexts: Sequence[ContextSpec], limits: RunLimits
    ) -> RunStart:
        """The event that opens a run's log: what it was asked, over which contexts, within which limits."""
        return RunStart(
            run_id=run_id,
            depth=depth,
            query=query,
            contexts=[
                ContextRecord(context_id=c.context_id, name=c.name, kind=c.kind, chars=c.chars) for c in contexts
            ],
            limits=LimitsRecord(
                max_iterations=limits.max_iterations,
                max_depth=limits.max_depth,
                timeout_s=limits.timeout_s,
                token_budget=limits.token_budget,
                max_errors=limits.max_errors,
            ),
            model=self.settings.model,
            sub_model=self.settings.effective_sub_model,
            prompt_profile=self.profile.name,
        )

    async def _store_history(
        self, ctx: RunContext, sandbox: Sandbox, status: RunStatus, session: SessionSandbox
    ) -> None:
        """Bind the finished root conversation as the next `history_k` (the reference's rule:
        the messages its last root call was sent, so a submitted answer's reply is not in it)."""
        messages = ctx.history.snapshot()
        if status == "completed":
            last_reply = max((i for i, e in enumerate(ctx.history.entries) if e.kind == "assistant"), default=None)
            if last_reply is not None:
                messages = messages[:last_reply]
        await sandbox.execute(store_history_code(session.history_count, messages), no_bridge)
        session.histories.append(messages)
        session.history_count += 1

    async def _open_and_loop(
        self,
        ctx: RunContext,
        stack: AsyncExitStack,
        query: str | None,
        contexts: Sequence[ContextSpec],
        session: SessionSandbox | None,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[RunStatus, str | None]:
        """Open the run's sandbox beside the loop's first root call (engine/opening.py), play the
        loop, and store a session's conversation. Failures are raised once the opening is
        settled: a session's opening finishes (its REPL stays what the session counts), a
        one-run opening is abandoned (the run's stack closes whatever it had opened)."""
        limits = ctx.limits
        levels_below = max(limits.max_depth - 1 - ctx.depth, 0)  # child runs this one may nest
        source: SandboxSource = session if session is not None else ONE_RUN
        numbering = session.numbering() if session is not None else (0, 0, [])
        opening = Opening(
            self.sandboxes, stack, contexts, levels_below, snapshot_chunk(self.settings.cell_output_bytes)
        )
        opener = SandboxOpener(
            source,
            opening,
            after=(lambda _: session.bound(contexts)) if session is not None else (lambda _: None),
            ready=ready,
        )
        bridge = make_bridge(ctx, run_child=child_runner(self._run, self.lm, self.settings, ctx.tree, ctx.run_id))
        failure: Exception | None = None
        outcome: tuple[RunStatus, str | None] = ("error", None)
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as loop_scope:  # cancelled when the sandbox cannot open
                tg.start_soon(opener.run, loop_scope)
                try:
                    outcome = await self._loop(ctx, opener, bridge, query, contexts, numbering)
                    if session is not None:
                        await self._store_history(ctx, (await opener.get()).sandbox, outcome[0], session)
                except Exception as exc:  # StopRun too: raised once the opening is settled
                    failure = exc
                if source.keeps:
                    await opener.settled()
            tg.cancel_scope.cancel()  # a one-run opening the run no longer needs
        if failure is None and loop_scope.cancelled_caught:
            failure = opener.error  # the sandbox could not open: the run had not started
        if failure is not None:
            raise failure
        return outcome

    async def _loop(
        self,
        ctx: RunContext,
        opener: SandboxOpener,
        bridge: LMBridge,
        query: str | None,
        contexts: Sequence[ContextSpec],
        numbering: tuple[int, int, list[ContextSpec]],
    ) -> tuple[RunStatus, str | None]:
        settings = self.settings
        ctx.window = await self.lm.window(settings.model)
        sub_window = await self.lm.window(settings.effective_sub_model, role="sub")
        # What one sub-prompt may hold: the window minus the answer budget (which the bridge
        # clamps for big prompts, so never claim less than half the window).
        sub_capacity = max(sub_window - settings.sub_max_tokens, sub_window // 2)
        history = ctx.history
        history.add("system", self.profile.system, "system", 0)
        first, histories, bound = numbering
        if first and not contexts:
            # A follow-up that adds no context (the reference always adds one): the metadata
            # describes the session's contexts, then says nothing new was added.
            metadata = await self.profile.metadata(query, bound, sub_capacity)
            metadata += "\n\n" + msg.no_new_context_note(first)
        else:
            metadata = await self.profile.metadata(query, contexts, sub_capacity, first_index=first)
        history.add("user", metadata, "metadata", 0)
        context_count = first + len(contexts)
        runner = TurnRunner(ctx, opener, bridge, context_count=context_count, profile=self.profile)
        max_iterations = ctx.limits.max_iterations
        for iteration in range(1, max_iterations + 1):
            text = self.profile.turn(iteration, max_iterations, context_count, histories)
            outcome = await runner.turn(iteration, text)
            if outcome is not None:
                return outcome
        if settings.submit_on_max_iterations:
            outcome = await runner.turn(max_iterations + 1, msg.submit_now_message(max_iterations))
            if outcome is not None and outcome[0] != "completed":
                return outcome
        return "max_iterations", f"max_iterations={max_iterations} reached" + (
            "; the answer was submitted on the extra turn" if ctx.answer.ready else ""
        )


__all__ = ["RLMEngine"]
