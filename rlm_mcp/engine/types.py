"""Public value types of the engine: limits, live progress, the structured result, events."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import pydantic

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import RunEvent
from rlm_mcp.lm.types import Usage

# The one status vocabulary of a run, from accepted to ended. "queued": it waits for a free run
# slot; "running": it holds one; the others are how it ended, exactly one per run (the answer,
# or the limit, failure or cancellation that stopped it first).
RunStatus = Literal[
    "queued", "running", "completed", "max_iterations", "timeout", "budget_exceeded", "error", "cancelled"
]


class RunPhase(StrEnum):
    """What a run is waiting on right now (shown in progress lines)."""

    QUEUED = "queued"  # for a free run slot (the service's semaphore)
    STARTING = "starting"
    SANDBOX = "sandbox"  # for its sandbox to open
    LM = "lm"  # for the root model's reply
    CELL = "cell"  # for code to run
    DONE = "done"


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


@dataclass
class RunLimits:
    """Limits of one run tree (children inherit what is left of time and tokens)."""

    max_iterations: int
    max_depth: int
    timeout_s: float
    token_budget: int | None
    max_errors: int


@dataclass
class RunProgress:
    """Live state of a run, mutated by the engine and read by the service (rlm_status)."""

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


class RunResult(pydantic.BaseModel):
    """What a run returns, whatever way it ended."""

    status: RunStatus
    answer: str | None
    reason: str | None
    run_id: str
    iterations: int
    usage: dict[str, Any]
    duration_s: float
    sub_calls: int
