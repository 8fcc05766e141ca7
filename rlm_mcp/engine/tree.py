"""State shared by every run of one recursion tree: deadline, token budget, usage, counters."""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass, field

import anyio

from rlm_mcp.call_lines import call_line
from rlm_mcp.engine.types import CallSink, EventSink, RunLimits, RunProgress
from rlm_mcp.events import CallRole, RunEvent
from rlm_mcp.ports.chat import CallRecord, Completion
from rlm_mcp.usage import Usage

log = logging.getLogger("rlm_mcp.engine")

# (batch, index) of the sub-call the current task is answering. The bridge sets it in each
# prompt's task, so the `llm_call` and `child_start` events it leads to name their batch
# without threading ids through every call signature.
SUB_CALL_SLOT: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("sub_call_slot", default=None)


@dataclass(frozen=True)
class Where:
    """The cell (iteration, block) and sub-call slot (batch, index) an event belongs to."""

    iteration: int | None = None
    block: int | None = None
    batch: int | None = None
    index: int | None = None


def usage_record(usage: Usage) -> Usage:
    """The usage of a run tree at this moment, as an event or a result keeps it."""
    return usage.copy_of()


@dataclass
class RunTree:
    """One per top-level `run()`; children share it, so limits and accounting span the tree."""

    progress: RunProgress  # the root run's live progress (sub_calls and usage are tree-wide)
    limits: RunLimits
    deadline: float  # anyio clock
    sink: EventSink
    max_sub_calls: int
    max_prompts_per_batch: int
    max_concurrent_children: int
    # Where each LM call's `llm_call` event goes as its line's values (no model built); None:
    # the event's model goes to `sink` like every other event.
    call_sink: CallSink | None = None
    child_count: int = 0
    batch_count: int = 0
    # run_id -> (iteration, block) of the cell that run is executing: sub-call events name it.
    open_cells: dict[str, tuple[int, int]] = field(default_factory=dict)
    _child_limiters: dict[int, anyio.CapacityLimiter] = field(default_factory=dict)

    @property
    def usage(self) -> Usage:
        return self.progress.usage

    def budget_left(self) -> int | None:
        if self.limits.token_budget is None:
            return None
        return self.limits.token_budget - self.usage.total.total

    def over_budget(self) -> bool:
        left = self.budget_left()
        return left is not None and left < 0

    def record(self, record: CallRecord) -> None:
        """Account one LM call, whatever its depth or role (exact server-reported usage)."""
        self.usage.add_call(record)

    def child_limiter(self, depth: int) -> anyio.CapacityLimiter:
        """The limiter of child runs at `depth`: one per depth, never one for the whole tree.

        A parent keeps its own slot while it waits for its children; were the slots shared across
        depths, children could hold every slot and wait forever for grandchildren's. Per depth, a
        slot holder only ever waits for slots one level deeper: no cycle, so no deadlock.
        """
        limiter = self._child_limiters.get(depth)
        if limiter is None:
            limiter = self._child_limiters[depth] = anyio.CapacityLimiter(self.max_concurrent_children)
        return limiter

    def reserve_sub_calls(self, wanted: int) -> int:
        """Take up to `wanted` sub-call slots from the tree's allowance; return how many were granted."""
        granted = max(0, min(wanted, self.max_sub_calls - self.progress.sub_calls))
        self.progress.sub_calls += granted
        return granted

    def next_batch(self) -> int:
        self.batch_count += 1
        return self.batch_count

    def where(self, run_id: str) -> Where:
        """The cell and sub-call slot an event of `run_id` belongs to (all None outside a cell)."""
        cell = self.open_cells.get(run_id)
        slot = SUB_CALL_SLOT.get()
        iteration, block = cell if cell is not None else (None, None)
        batch, index = slot if slot is not None else (None, None)
        return Where(iteration=iteration, block=block, batch=batch, index=index)

    async def emit(self, event: RunEvent) -> None:
        """Send an event; a failing sink is logged and ignored, never allowed to end a run."""
        try:
            await self.sink(event)
        except Exception:
            log.exception("event sink failed on %s event", event.type)

    async def emit_call(
        self,
        *,
        role: CallRole,
        run_id: str,
        model: str,
        completion: Completion | None,
        latency_s: float,
        error: str | None,
        depth: int,
        where: Where,
        prompt: str | None = None,
        prompt_chars: int | None = None,
        answer: str | None = None,
        answer_chars: int | None = None,
        failed: CallRecord | None = None,
    ) -> None:
        """The `llm_call` event of one root or sub call: `where` names the turn (root) or the
        cell and batch slot (sub); a sub-call also records the head and tail of its prompt and
        answer. A failed call has no completion; `failed` is its record as the LM client
        accounted it, so the retries, 429s and sleeps that came before the failure are logged.
        Built as its log line's values (`call_lines.call_line`), not as the event's model: the
        model is built only when no `call_sink` takes the line."""
        record = completion.record if completion is not None else failed
        # What the call waited besides its answer, each only when there was some: the fields
        # left out are their default (None), as most calls neither queued, retried nor slept.
        cost_usd = queued_s = retries = throttled = backoff_s = None
        if record is not None:
            cost_usd = record.cost_usd
            if record.queued_s >= 0.001:
                queued_s = round(record.queued_s, 3)
            retries = record.retries or None
            throttled = record.throttled or None
            backoff_s = round(record.backoff_s, 3) or None
        call = call_line(
            run_id=run_id,
            role=role,
            model=model,
            prompt_tokens=record.prompt_tokens if record else 0,
            completion_tokens=record.completion_tokens if record else 0,
            latency_s=round(latency_s, 4),
            finish_reason=completion.finish_reason if completion is not None else None,
            error=error,
            depth=depth,
            iteration=where.iteration,
            block=where.block,
            batch=where.batch,
            index=where.index,
            prompt=prompt,
            prompt_chars=prompt_chars,
            answer=answer,
            answer_chars=answer_chars,
            cost_usd=cost_usd,
            queued_s=queued_s,
            retries=retries,
            throttled=throttled,
            backoff_s=backoff_s,
        )
        if self.call_sink is None:
            await self.emit(call.event())
            return
        # As `emit`: a failing sink is logged and ignored, never allowed to end a run.
        try:
            await self.call_sink(call)
        except Exception:
            log.exception("event sink failed on %s event", call.type)
