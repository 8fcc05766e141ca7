"""Public value types of the engine: limits, live progress, the structured result, events."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rlm_mcp.call_lines import CallLine
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import RunEvent
from rlm_mcp.ports.runs import LiveState, Notice, RunLimits, RunPhase, RunResult, RunStatus, Usage

# The run's limits, phase, status and result are the run contract's (rlm_mcp.ports.runs).
__all__ = [
    "CallSink",
    "EventSink",
    "RunLimits",
    "RunNotStarted",
    "RunPhase",
    "RunProgress",
    "RunResult",
    "RunStatus",
    "Usage",
]


class RunNotStarted(Exception):
    """The run failed before it started, so the caller gets `cause` itself (a tool error
    naming the cause and fix), not a structured result.

    The engine raises it while the root model has not replied once (see `RunContext.started`);
    the service raises it for what happens before the engine (no free slot, a context gone).
    """

    def __init__(self, cause: RlmMcpError) -> None:
        super().__init__(str(cause))
        self.cause = cause


# The service's sink for run events (JSONL log, MCP progress). It must not raise; the engine
# still guards every call so a faulty sink can never end a run.
EventSink = Callable[[RunEvent], Awaitable[None]]
# Where the service takes each LM call's `llm_call` event as its log line's values
# (`call_lines.CallLine`), without the event's model; the same promises as `EventSink`. Without
# one, the engine builds the model (`CallLine.event()`) and sends it to the `EventSink`.
CallSink = Callable[[CallLine], Awaitable[None]]


@dataclass
class RunProgress:
    """Live state of a run, mutated by the engine and read by the service (rlm_status): the
    mutable form of the contract's `LiveState` (`live` reads it as one, `apply` takes one in),
    so the run's record, its announcement and its status view are all derived from it."""

    run_id: str
    max_iterations: int
    iterations: int = 0
    sub_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    status: RunStatus = "running"
    started: float = field(default_factory=time.monotonic)
    phase: RunPhase = RunPhase.STARTING  # what the root is waiting on
    children: int = 0  # child RLM runs started in this tree
    elided_messages: int = 0  # REPL outputs / replies currently replaced by a marker

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def live(self, *, notice: Notice | None = None, last_event: str | None = None) -> LiveState:
        """The run's live state now (`notice`, `last_event`: what the service says beside the
        engine's counters). Built without validation: every value is already of its type, and
        it is read on each progress report."""
        return LiveState.model_construct(
            status=self.status,
            phase=self.phase,
            iterations=self.iterations,
            max_iterations=self.max_iterations,
            sub_calls=self.sub_calls,
            usage=self.usage.copy_of(),
            elapsed_s=round(self.elapsed_s, 3),
            notice=notice,
            last_event=last_event,
        )

    def apply(self, state: LiveState) -> None:
        """Take the counters of `state` (a team-mode front following a run another process
        executes: its announced live state or its record)."""
        self.status = state.status
        self.iterations = state.iterations
        self.sub_calls = state.sub_calls
        self.usage = state.usage.copy_of()
        if state.phase is not None:
            self.phase = state.phase
        if state.elapsed_s is not None and self.status != "queued":
            self.started = time.monotonic() - state.elapsed_s
