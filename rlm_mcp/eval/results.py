"""One result line per task: the record `results.jsonl` holds (its keys are a contract)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rlm_mcp.eval.result_check import parse_result_line
from rlm_mcp.ports.runs import Usage

logger = logging.getLogger("rlm_mcp.eval")

RESULTS_FILE = "results.jsonl"
BASELINE_FILES = {"direct": "baseline-direct.jsonl"}
SUMMARY_FILE = "summary.md"


class TaskResult(BaseModel):
    """How one task ended and what it scored. `status` is the run's status (completed,
    max_iterations, timeout, budget_exceeded, error, cancelled), or `error` when it never ran."""

    id: str
    mode: str = "rlm"  # rlm | direct
    status: str
    answer: str | None
    expected: Any
    scorer: str
    score: float
    lenient_score: float | None = None  # the training environment's score, where it differs
    usage: Usage = Field(default_factory=Usage)
    sub_calls: int = 0
    iterations: int = 0
    duration_s: float = 0.0
    run_id: str | None = None
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.usage.total.total


def read_results(path: Path) -> dict[str, TaskResult]:
    """The results already written, by task id (the last line wins). A line that is not a valid
    result (a torn write, a traceback, NaN; see `result_check`) is ignored: that task runs again."""
    found: dict[str, TaskResult] = {}
    if not path.exists():
        return found
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            result = parse_result_line(line, TaskResult)  # NaN, inf, scores outside [0, 1] are refused too
        except ValueError as why:
            logger.warning("%s:%d is not a result line (%s); its task will run again", path, number, why)
            continue
        found[result.id] = result
    return found


def append_result(path: Path, result: TaskResult) -> None:
    """One line, written and flushed at once, so an interruption loses at most the tasks in flight."""
    line = json.dumps(result.model_dump(), ensure_ascii=False, default=str) + "\n"
    with path.open("a", encoding="utf-8") as out:
        out.write(line)
        out.flush()
