"""Public value types of the engine: limits, live progress, the structured result, events."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic

from rlm_mcp.lm.types import Usage

RunStatus = Literal["running", "completed", "max_iterations", "timeout", "budget_exceeded", "error", "cancelled"]

# The service's sink for run events (JSONL log, MCP progress). It must not raise; the engine
# still guards every call so a faulty sink can never end a run.
EventSink = Callable[[dict[str, Any]], Awaitable[None]]


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
    phase: str = "starting"  # starting | lm | cell | sub_calls | done: what the root is waiting on
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
