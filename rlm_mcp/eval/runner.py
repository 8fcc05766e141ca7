"""Run a task file through the service (the same path as `rlm_complete`), score, write results.

Resume: a task with a line in `results.jsonl` is not run again (delete its line to redo it),
except one that ended in `error` (an unreachable endpoint, a context that could not be read):
that runs again unless `keep_errors` is set. Tasks in flight when the eval is interrupted leave
no line and run at the next invocation.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.assembly import build_service
from rlm_mcp.config import Settings
from rlm_mcp.config.one_off import for_one_off_command, opening_local_paths
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.eval.baseline import run_direct
from rlm_mcp.eval.display import Display
from rlm_mcp.eval.judge import Judge
from rlm_mcp.eval.results import BASELINE_FILES, RESULTS_FILE, TaskResult, append_result, read_results
from rlm_mcp.eval.scorers import LENIENT, SCORERS
from rlm_mcp.eval.tasks import Task
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.service.service import RlmService

logger = logging.getLogger("rlm_mcp.eval")


@dataclass
class EvalOptions:
    task_file: Path
    output_dir: Path
    parallel: int = 1
    baseline: str | None = None  # "direct"
    overrides: RunOverrides = field(default_factory=RunOverrides)  # max_iterations, timeout_s, ...
    judge_model: str | None = None
    judge_base_url: str | None = None
    keep_errors: bool = False  # resume: errored tasks count as done instead of running again


def settled(results: dict[str, TaskResult], keep_errors: bool) -> dict[str, TaskResult]:
    """The results a resumed eval keeps: all of them with `keep_errors`, else all but errors."""
    return {k: r for k, r in results.items() if keep_errors or r.status != "error"}


def eval_settings(settings: Settings, tasks: list[Task], options: EvalOptions) -> Settings:
    """The user's settings, with room for N parallel runs and the tasks' own files readable (a
    local command's paths: `opening_local_paths`). In team mode its runs go to the team's workers,
    as `rlm-mcp run`'s do."""
    paths = [p for t in tasks if (p := t.resolved_context_path(options.task_file)) is not None]
    parallel = max(1, options.parallel)
    return opening_local_paths(for_one_off_command(settings), paths).model_copy(
        update={
            "max_runs": max(settings.runs.max_runs, parallel),
            "max_sandboxes": max(settings.sandbox.max_sandboxes, parallel + 1),
            "run_queue_timeout_s": max(settings.runs.run_queue_timeout_s, 86_400.0),
        }
    )


class ContextCache:
    """Each distinct context goes into the store once per eval, however many tasks share it."""

    def __init__(self, service: RlmService, task_file: Path) -> None:
        self._local = Caller(service, LOCAL_OWNER)
        self._task_file = task_file
        self._ids: dict[str, str] = {}
        self._locks: dict[str, anyio.Lock] = {}

    async def context_id(self, task: Task) -> str:
        path = task.resolved_context_path(self._task_file)
        if path is not None:
            key = f"path:{path.resolve()}"
        else:
            key = "text:" + hashlib.sha256((task.context or "").encode("utf-8")).hexdigest()
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self._ids:
                if path is not None:
                    info = await self._local.load_context(path=str(path), name=path.name)
                else:
                    info = await self._local.load_context(text=task.context, name=f"task {task.id}")
                self._ids[key] = info.context_id
            return self._ids[key]


class Scoring:
    """Scores an answer with the task's scorer (and the lenient twin where there is one)."""

    def __init__(self, judge: Judge | None) -> None:
        self._judge = judge

    async def score(self, task: Task, answer: str | None) -> tuple[float, float | None, str | None]:
        if task.scorer == "judge":
            if self._judge is None:
                return 0.0, None, "no judge configured"
            value, error = await self._judge.grade(task.query, task.answer, answer)
            return value, None, error
        value = SCORERS[task.scorer](answer, task.answer, task.metadata)
        lenient = LENIENT.get(task.scorer)
        return value, (lenient(answer, task.answer, task.metadata) if lenient else None), None


def _result(task: Task, scored: tuple[float, float | None], **outcome: Any) -> TaskResult:
    """A task's result, one way for both modes: the task names itself (id, expected answer,
    scorer), `scored` is (score, lenient score), `outcome` what the run or direct call gave."""
    score, lenient = scored
    return TaskResult(
        id=task.id, expected=task.answer, scorer=task.scorer, score=score, lenient_score=lenient, **outcome
    )


def _not_run(task: Task, started: float, exc: RlmMcpError, lenient: float | None = None, **outcome: Any) -> TaskResult:
    """A task whose run or call never started: a 0, with the reason, timed from `started`."""
    return _result(
        task,
        (0.0, lenient),
        status="error",
        answer=None,
        duration_s=time.monotonic() - started,
        error=str(exc),
        **outcome,
    )


async def _rlm_result(
    service: RlmService, contexts: ContextCache, scoring: Scoring, task: Task, overrides: RunOverrides, display: Display
) -> TaskResult:
    started = time.monotonic()

    async def report(progress: float, total: float | None, message: str) -> None:
        display.update(task.id, message)

    try:
        context_id = await contexts.context_id(task)
        run = await Caller(service, LOCAL_OWNER).complete(task.query, context_id, overrides, report)
    except RlmMcpError as exc:  # the run never started (or its start failed): a 0, with the reason
        return _not_run(task, started, exc, 0.0 if task.scorer in LENIENT else None, metadata=task.metadata)
    answer = run.answer if run.status == "completed" else None
    value, lenient, error = await scoring.score(task, answer)
    return _result(
        task,
        (value, lenient),
        status=run.status,
        answer=run.answer,
        usage=run.usage,
        sub_calls=run.sub_calls,
        iterations=run.iterations,
        duration_s=run.duration_s,
        run_id=run.run_id,
        error=error if run.status == "completed" else (error or run.reason),
        metadata=task.metadata,
    )


async def _direct_result(
    service: RlmService, settings: Settings, contexts: ContextCache, scoring: Scoring, task: Task
) -> TaskResult:
    started = time.monotonic()
    try:
        info = await service.contexts.get(await contexts.context_id(task), owner=LOCAL_OWNER)
    except RlmMcpError as exc:
        return _not_run(task, started, exc, mode="direct")
    # Pinned, and fetched into this replica's cache in team mode, while the direct call reads it.
    async with service.contexts.in_use([info.context_id], owner=LOCAL_OWNER):
        path = service.contexts.spec(info).path
        done = await run_direct(service.lm, settings, path, task.query)
    value, lenient, error = await scoring.score(task, done.answer)
    return _result(
        task,
        (value, lenient),
        mode="direct",
        status=done.status,
        answer=done.answer,
        usage=done.usage,
        iterations=1,
        duration_s=done.duration_s,
        error=done.error or error,
        metadata={**task.metadata, "context_chars_sent": done.context_chars, "context_cut": done.cut},
    )


async def run_eval(tasks: list[Task], settings: Settings, options: EvalOptions, display: Display) -> None:
    """Run every task not yet in the output files; each result is appended as soon as it is scored."""
    options.output_dir.mkdir(parents=True, exist_ok=True)
    results_path = options.output_dir / RESULTS_FILE
    done = settled(read_results(results_path), options.keep_errors)
    baseline_path = options.output_dir / BASELINE_FILES[options.baseline] if options.baseline else None
    baseline_done = settled(read_results(baseline_path), options.keep_errors) if baseline_path else {}
    pending = [t for t in tasks if t.id not in done or (baseline_path and t.id not in baseline_done)]
    if not pending:
        return
    judge = None
    if any(t.scorer == "judge" for t in pending):
        judge = Judge(settings, model=options.judge_model, base_url=options.judge_base_url)
    scoring = Scoring(judge)
    slots = anyio.CapacityLimiter(max(1, options.parallel))
    try:
        served = eval_settings(settings, tasks, options)  # what the service runs with, and the direct calls
        async with build_service(served, mode="stdio") as service:
            contexts = ContextCache(service, options.task_file)

            async def one(task: Task) -> None:
                async with slots:
                    if task.id not in done:
                        display.started(task.id)
                        result = await _rlm_result(service, contexts, scoring, task, options.overrides, display)
                        append_result(results_path, result)
                        display.finished(result)
                    if baseline_path is not None and task.id not in baseline_done:
                        result = await _direct_result(service, served, contexts, scoring, task)
                        append_result(baseline_path, result)
                        display.finished(result)

            async with anyio.create_task_group() as tg:
                for task in pending:
                    tg.start_soon(one, task)
    finally:
        if judge is not None:
            with anyio.CancelScope(shield=True):
                await judge.aclose()
