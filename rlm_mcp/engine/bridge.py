"""Answering the sandbox's sub-calls: `llm_query*` (one LM call per prompt) and `rlm_query*`
(a child RLM when depth allows, else the same as `llm_query`).

Every failure reaches the code as a string starting with "Error: "; nothing here raises into
the sandbox, and nothing stalls: over-limit requests are answered at once with error strings.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

import anyio
import anyio.lowlevel

from rlm_mcp.engine.formatting import head_tail
from rlm_mcp.engine.tree import SUB_CALL_SLOT
from rlm_mcp.engine.turn import RunContext
from rlm_mcp.events import SubCalls
from rlm_mcp.observability import tracing
from rlm_mcp.ports import LMBridge, LMRequest
from rlm_mcp.ports.chat import CallRecord, Completion, LMContextLengthError, LMError

log = logging.getLogger("rlm_mcp.engine")

# Chat-template overhead of a one-message prompt; prompts this far under the window skip the
# exact count (one fewer HTTP round trip per sub-call). Measured in UTF-8 bytes, not chars: a
# byte-level BPE token is never under 1 byte, but one emoji or rare CJK char can be 2-4 tokens.
_TEMPLATE_SLACK = 64
# A sub-call needs at least this much room to answer; less is reported as "prompt too large".
_MIN_SUB_COMPLETION = 256

ChildRunner = Callable[[str, int], Awaitable[str]]


def make_bridge(ctx: RunContext, *, run_child: ChildRunner) -> LMBridge:
    """The bridge the run of `ctx` hands to `sandbox.execute` (its settings, LM, tree, depth and id)."""
    return SubCallBridge(ctx, run_child=run_child)


class SubCallBridge:
    """One run's sub-calls: the model policy and limits (`__call__`), one LM call per prompt
    (`one_llm`), a child RLM per prompt (`one_child`), and their events."""

    def __init__(self, ctx: RunContext, *, run_child: ChildRunner) -> None:
        # The run's settings, LM, tree, depth and id are read from its context, their one owner.
        self.ctx = ctx
        self.run_child = run_child
        self.sub_model = ctx.settings.effective_sub_model
        self.allowed_models = ctx.settings.sandbox_models
        self._known_windows: dict[str, int] = {}  # per model, once the client knows it (see `fit`)

    def emit(
        self,
        model: str,
        completion: Completion | None,
        latency: float,
        error: str | None,
        prompt: str,
        answer: str,
        *,
        failed: CallRecord | None = None,
    ) -> Awaitable[None]:
        """The sub-call's `llm_call` event, to await: the tree's own coroutine, handed back rather
        than awaited in one more frame (one per sub-call, 200 in a batch)."""
        tree, text_cap = self.ctx.tree, self.ctx.settings.log_sub_call_chars
        # Sub-calls are made by the run at `depth`; they are accounted one level below it.
        # The log keeps the head and tail of what the sub-LM saw and said, with full lengths.
        return tree.emit_call(
            role="sub",
            run_id=self.ctx.run_id,
            model=model,
            completion=completion,
            latency_s=latency,
            error=error,
            depth=self.ctx.depth + 1,
            where=tree.where(self.ctx.run_id),
            prompt=head_tail(prompt, text_cap),
            prompt_chars=len(prompt),
            answer=head_tail(answer, text_cap),
            answer_chars=len(answer),
            failed=failed,
        )

    def fits(self, prompt: str, model: str) -> bool:
        """Whether the prompt is far enough under the model's known window to take the whole
        completion budget without an exact count: `fit`'s answer then, without its coroutine
        (every sub-call asks; nearly every prompt is that far under)."""
        window = self._known_windows.get(model)
        return window is not None and (
            len(prompt.encode("utf-8", "surrogatepass")) + _TEMPLATE_SLACK <= window - self.ctx.settings.sub_max_tokens
        )

    async def fit(self, prompt: str, model: str) -> int | str:
        """The completion budget this prompt leaves in the model's window, or an error string."""
        lm, max_tokens = self.ctx.lm, self.ctx.settings.sub_max_tokens
        window = self._known_windows.get(model)
        if window is None:
            window = await lm.window(model, role="sub")
            # Refuse or clamp only against a window the server reported (or the setting); with
            # the 16384 fallback the server itself decides, and a rejection comes back as text.
            if not await lm.window_known(model, role="sub"):
                return max_tokens
            # A known window never changes (the setting, or what the server reported, kept by
            # the client): asked once per run and model, not twice per sub-call.
            self._known_windows[model] = window
        if len(prompt.encode("utf-8", "surrogatepass")) + _TEMPLATE_SLACK > window - max_tokens:
            tokens = await lm.count_tokens([{"role": "user", "content": prompt}], model=model, role="sub")
            room = window - tokens
            if room < min(_MIN_SUB_COMPLETION, max_tokens):
                return (
                    f"Error: this prompt is {tokens} tokens ({len(prompt)} chars) but the sub-LLM "
                    f"window is {window} tokens; send at most about {max(window - max_tokens, 0)} tokens "
                    "per prompt (split the text into smaller chunks)."
                )
            max_tokens = min(max_tokens, room)
        return max_tokens

    async def one_llm(self, prompt: str, model: str) -> str:
        tree = self.ctx.tree
        if not isinstance(prompt, str):
            return f"Error: llm_query needs a str prompt, got {type(prompt).__name__}."
        if tree.over_budget():
            return "Error: the run's token budget is spent; no more sub-calls can be made."
        started = time.monotonic()
        try:
            fitted = self.ctx.settings.sub_max_tokens if self.fits(prompt, model) else await self.fit(prompt, model)
            if isinstance(fitted, str):
                return fitted
            completion = await self.ctx.lm.complete(
                [{"role": "user", "content": prompt}],
                model=model,
                max_tokens=fitted,
                role="sub",
                session=self.ctx.run_id,
            )
        except LMContextLengthError as exc:
            if exc.record is not None:  # a rejected call is a call, as everywhere else (exact usage)
                tree.record(exc.record)
            said = getattr(exc, "server_message", None) or str(exc)
            reply = f"Error: this prompt ({len(prompt)} chars) is too large for the sub-LLM's window: {said} Split the text into smaller chunks."
            await self.emit(model, None, time.monotonic() - started, str(exc), prompt, reply, failed=exc.record)
            return reply
        except LMError as exc:
            if exc.record is not None:  # a failed call still counts (and may have used tokens)
                tree.record(exc.record)
            reply = f"Error: sub-LLM call failed: {exc}"
            await self.emit(model, None, time.monotonic() - started, str(exc), prompt, reply, failed=exc.record)
            return reply
        except Exception as exc:
            log.exception("sub-call failed unexpectedly")
            return f"Error: sub-LLM call failed: {type(exc).__name__}: {exc}"
        tree.record(completion.record)
        await self.emit(model, completion, time.monotonic() - started, None, prompt, completion.text)
        return completion.text

    async def one_child(self, prompt: str) -> str:
        tree, child_depth = self.ctx.tree, self.ctx.depth + 1
        # Like llm_query: a spent tree budget starts no child (each would make at
        # least one full root call); checked again once a child slot is free.
        async with tree.child_limiter(child_depth):
            if tree.over_budget():
                return "Error: the run's token budget is spent; no more sub-calls can be made."
            return await self.run_child(prompt, child_depth)

    def model_for(self, request: LMRequest) -> str:
        # The model policy's one owner is here: the sub model, the root model (unless sub-calls
        # go to another server) and RLM_MCP_ALLOWED_SUB_MODELS; any other name falls back to the
        # sub model.
        if request.model is not None and request.model in self.allowed_models:
            return request.model
        if request.model:
            # Training ignored `model`; an unknown name falls back to the sub model, not an error.
            log.debug("sub-call asked for model %r; using %r", request.model, self.sub_model)
        return self.sub_model

    async def __call__(self, request: LMRequest) -> list[str]:
        tree, depth, run_id = self.ctx.tree, self.ctx.depth, self.ctx.run_id
        prompts = list(request.prompts)
        count = len(prompts)
        if count == 0:
            return []
        # The batch size was bounded by the sandbox's gate (sandbox/lm_gate.py, its one owner).
        model = self.model_for(request)
        granted = tree.reserve_sub_calls(count)
        refused = f"Error: the run's limit of {tree.max_sub_calls} sub-calls is reached; finish with what you have."
        recursive = request.kind == "rlm" and depth + 1 < tree.limits.max_depth

        # The prompt's coroutine itself, not one awaiting it: every resumption of a call (its
        # request's steps, 200 calls in a batch) passes through each frame of the chain.
        worker: Callable[[str], Awaitable[str]] = self.one_child if recursive else partial(self.one_llm, model=model)

        # As many at once as can be served at once: the process's LM slots, or the tree's
        # children per depth (engine/tree.py), each the ceiling its calls wait under anyway.
        width = tree.max_concurrent_children if recursive else self.ctx.settings.max_concurrent_lm_calls
        batch = tree.next_batch()
        where = tree.where(run_id)
        batch_started = time.monotonic()
        attributes = {
            "rlm.sub_calls.count": count,
            "rlm.sub_calls.kind": "rlm" if recursive else "llm",
            "rlm.depth": depth,
        }
        with tracing.span("rlm.sub_calls", attributes) as span:
            results = await _gather(prompts[:granted], worker, batch, width) + [refused] * (count - granted)
            if count > granted:
                span.set_attribute("rlm.sub_calls.refused", count - granted)
        failed = sum(1 for r in results if r.startswith("Error: "))
        await tree.emit(
            SubCalls(
                run_id=run_id,
                batch=batch,
                duration_s=round(time.monotonic() - batch_started, 4),
                refused=count - granted,
                iteration=where.iteration,
                block=where.block,
                kind="rlm" if recursive else "llm",
                requested_kind=request.kind,
                count=count,
                failed=failed,
                total_sub_calls=tree.progress.sub_calls,
                depth=depth,
            )
        )
        return results


async def _gather(prompts: list[str], worker: Callable[[str], Awaitable[str]], batch: int, width: int) -> list[str]:
    """Each prompt's answer, in prompt order, from at most `width` tasks taking prompts in order.

    A task per prompt would run every prompt's first steps (checks, window fitting, the call's
    body, bookkeeping) before the first request of a big batch left; `width` tasks, as many as
    can be in flight at once, keep that work next to each prompt's own request.
    """
    if not prompts:  # every prompt refused (the run's sub-call limit)
        return []
    if len(prompts) == 1:
        # One prompt (every llm_query): its call runs in this task, with the slot set for the
        # events it causes and reset after. A task group of one task cost this call two more
        # event-loop rounds (the task's start, the group's join) and nothing ran beside it.
        token = SUB_CALL_SLOT.set((batch, 0))
        try:
            return [await worker(prompts[0])]
        except Exception as exc:  # as in a batch: the prompt's answer says it failed
            log.exception("sub-call failed unexpectedly")
            return [f"Error: the sub-call failed: {type(exc).__name__}: {exc}"]
        finally:
            SUB_CALL_SLOT.reset(token)

    results: list[str] = [""] * len(prompts)
    pending = iter(enumerate(prompts))  # shared: each task takes the next prompt not yet taken

    async def slot() -> None:
        for index, prompt in pending:
            SUB_CALL_SLOT.set((batch, index))  # this task's own context: names the events it causes
            try:
                results[index] = await worker(prompt)
            except Exception as exc:  # one failing prompt must not fail its batch
                log.exception("sub-call failed unexpectedly")
                results[index] = f"Error: the sub-call failed: {type(exc).__name__}: {exc}"

    tasks = min(max(1, width), len(prompts))
    # A batch of more prompts than tasks runs in rounds, each task a chain of calls: the sooner
    # each chain's first request leaves, the sooner the batch ends. One of at most `tasks`
    # prompts gains nothing from that (it ends with its last request, which leaves after every
    # prompt's preparation either way), and the extra loop turns cost a zero-latency 16-way
    # batch ~8% more CPU per call, so it starts all its tasks at once.
    rounds = len(prompts) > tasks
    # The event loop's own tasks, not an anyio task group's: a group's task costs ~15 us more
    # CPU to start and end (its handle, its cancel scope, its events; 22 against 7 us per task
    # of sixteen, measured on the 2-core VM), one per sub-call of a batch. Structured all the
    # same: the batch returns once every task has ended, and a cancelled batch cancels each task
    # once, then waits for them shielded (below): a task's own shielded cleanup (a child run's
    # sandbox) is not cancelled again, as it would be under `asyncio.gather`, which passes on
    # every one of anyio's repeated cancellations of the batch.
    loop = asyncio.get_running_loop()
    running: list[asyncio.Task[None]] = []
    joined: asyncio.Future[None] = loop.create_future()  # set once the last task has ended
    unended = tasks

    def ended(_: asyncio.Task[None]) -> None:
        nonlocal unended
        unended -= 1
        if not unended and not joined.done():
            joined.set_result(None)

    try:
        for started in range(1, tasks + 1):
            running.append(task := loop.create_task(slot()))
            task.add_done_callback(ended)
            if rounds and started & (started - 1) == 0 and started < tasks:
                # Let the tasks started so far take their first steps, and what those schedule
                # (the client writes a request's body in a task of its own), before starting as
                # many again: the first request leaves after one prompt's preparation, the k-th
                # after at most 2k, in log2(tasks) loop turns (one turn per task cost a
                # zero-latency 200-way batch ~7% more CPU).
                await anyio.lowlevel.checkpoint()
        # Waits for the tasks without `asyncio.wait`'s set, checks and callbacks per call; being
        # cancelled here cancels no task (`finally` does, once).
        await joined
    finally:
        left = [task for task in running if not task.done()]
        if left:  # the batch was cancelled: each task once, then their ends awaited
            for task in left:
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait(left)
    for task in running:
        task.result()  # a task fails only if cancelled on its own (`slot` answers every error)
    return results
