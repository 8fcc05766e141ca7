"""MCP Tasks (SEP-2663, the extension `io.modelcontextprotocol/tasks` of the 2026-07-28 revision)
for `rlm_complete`, on the SDK's Extension API.

The SDK (`mcp` 2.3) has the Extension API but no Tasks runtime, and does not check that a client
declared an extension; its maintainers plan Tasks as a library of their own. This module is the
whole of rlm-mcp's Tasks support, so it is the one thing to replace when that library ships.

- When it applies: a `tools/call` of a task tool (`rlm_complete`) in the 2026-07-28 era whose
  request declares the extension in `_meta["io.modelcontextprotocol/clientCapabilities"]
  .extensions`. Such a call always answers as a task once its run is accepted (`resultType:
  "task"`); a call refused before a run exists (bad arguments, an unknown context) answers at
  once as the tool error it is today. Every other call (the handshake era, no declaration, other
  tools) is untouched; `rlm_start` and the other handles stay.
- One task per run, and the task id IS the run id (`run_` and 80 random bits): the task's state
  is derived from the run's record in the store each time it is asked, so every replica of a team
  answers `tasks/get` and `tasks/cancel` for a task another accepted, and nothing else is stored.
  Lookups go through the owner's view of the runs: an unknown task and another owner's task
  answer the same invalid-params error.
- Outcomes as the SEP maps them: a run that ended (an answer, a limit reached, an error) is
  `completed` with the tool's result inline (`isError` for a run that erred or never started);
  a cancelled run is `cancelled`; `failed` is for protocol errors, which a run never is. Progress
  is the task's `statusMessage`. `ttlMs` is the age retention of run records
  (RLM_MCP_RUN_MAX_AGE_DAYS; null when records are kept for ever).
- Status notifications (`notifications/tasks` on a `subscriptions/listen` stream naming
  `taskIds`) are server/task_listen.py's.
- `tasks/*` are refused with -32021 when the request does not declare the extension, and with
  -32020 when an `Mcp-Name` header disagrees with the task id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    ClientCapabilities,
    MissingRequiredClientCapabilityErrorData,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from rlm_mcp.errors import NotFoundError, RlmMcpError
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.server.schemas import RunOutcome
from rlm_mcp.service.caller import Caller

TASKS = "io.modelcontextprotocol/tasks"
# The tools that answer as a task: `rlm_complete` is the one that holds its call open for a run.
TASK_TOOLS = frozenset({"rlm_complete"})
# How often a client should ask again: a run's turn takes seconds, its whole life minutes.
POLL_INTERVAL_MS = 2000
UNKNOWN_TASK = "Unknown task: {task_id}. Use a taskId returned by a tools/call answered as a task."


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


@dataclass
class TaskClaim:
    """Set while a task tool runs for a request that asked for a task: the tool starts the run
    instead of waiting for it, and leaves its id here."""

    run_id: str | None = None


_claim: ContextVar[TaskClaim | None] = ContextVar("rlm_mcp_task_claim", default=None)


def task_claim() -> TaskClaim | None:
    """The claim of the current tool call when it is to answer as a task, else None."""
    return _claim.get()


@contextmanager
def _claiming() -> Iterator[TaskClaim]:
    claim = TaskClaim()
    token = _claim.set(claim)
    try:
        yield claim
    finally:
        _claim.reset(token)


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request is in the 2026-07-28 era and declares the Tasks extension in its own
    capabilities (checked here: the SDK does not)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    meta: Mapping[str, Any] = ctx.meta or {}
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and TASKS in extensions


def _require_declared(ctx: ServerRequestContext[Any, Any]) -> None:
    if not declares_tasks(ctx):
        data = MissingRequiredClientCapabilityErrorData(
            required_capabilities=ClientCapabilities(extensions={TASKS: {}})
        )
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message=f"This request does not declare the {TASKS} extension in its client capabilities.",
            data=data.model_dump(by_alias=True, mode="json", exclude_none=True),
        )


def _check_routing_header(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """An `Mcp-Name` header on a tasks/* request names the task; one naming another is refused
    (a proxy may have routed on it)."""
    headers = getattr(ctx.request, "headers", None)
    named = headers.get("mcp-name") if headers is not None else None
    if named is not None and named != task_id:
        raise MCPError(code=HEADER_MISMATCH, message="The Mcp-Name header does not match params.taskId.")


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


def _progress_line(record: RunRecord) -> str:
    if record.status == "queued":
        line = "queued"
    else:
        turns = f"turn {record.iterations}/{record.max_iterations}" if record.max_iterations else "started"
        line = f"{turns} · {record.sub_calls} sub-call{'s' if record.sub_calls != 1 else ''}"
    return f"{line} · {record.notice.render()}" if record.notice is not None else line


def _tool_result(record: RunRecord, max_chars: int) -> dict[str, Any]:
    """The `tools/call` result the run's task carries once it ended: what `rlm_complete` answers,
    as the 2026-07-28 wire has it (`resultType` included: requesters validate the inline result)."""
    if record.not_started is not None:
        text = str(RlmMcpError(record.not_started.cause, record.not_started.fix))
        return {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": True}
    assert record.result is not None
    outcome = RunOutcome.of(record.result, max_chars=max_chars, session_id=record.request.session_id)
    structured = outcome.model_dump(mode="json")
    return {
        "resultType": "complete",
        "content": [{"type": "text", "text": json.dumps(structured)}],
        "structuredContent": structured,
        "isError": record.result.status == "error",
    }


@dataclass(frozen=True)
class TaskView:
    """How a run's record reads as a task."""

    ttl_ms: int | None
    max_chars: int

    def of(self, record: RunRecord) -> dict[str, Any]:
        ended = record.done or record.not_started is not None
        elapsed = record.result.duration_s if record.result is not None else record.elapsed_s
        task: dict[str, Any] = {
            "taskId": record.run_id,
            "createdAt": _iso(record.created_at),
            "lastUpdatedAt": _iso(record.created_at + (elapsed or 0.0)),
            "ttlMs": self.ttl_ms,
        }
        if not ended:
            return {
                **task,
                "status": "working",
                "statusMessage": _progress_line(record),
                "pollIntervalMs": POLL_INTERVAL_MS,
            }
        if record.status == "cancelled":
            return {
                **task,
                "status": "cancelled",
                "statusMessage": record.result.reason if record.result else "cancelled",
            }
        result = _tool_result(record, self.max_chars)
        return {**task, "status": "completed", "statusMessage": record.status, "result": result}


class RunTasks(Extension):
    """The Tasks extension over rlm-mcp's runs. `caller_for` gives the service as the request's
    owner sees it (the one place an owner is bound, server/app.py)."""

    identifier = TASKS

    def __init__(self, caller_for: Callable[[ServerRequestContext[Any, Any]], Caller], view: TaskView) -> None:
        self._caller_for = caller_for
        self._view = view

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (
            MethodBinding("tasks/get", TaskParams, self._get, versions),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, versions),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, versions),
        )

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name not in TASK_TOOLS or not declares_tasks(ctx):
            return await call_next(ctx)
        with _claiming() as claim:
            answered = await call_next(ctx)
        if claim.run_id is None:  # refused before a run existed: the tool error, at once
            return answered
        created = await self._task(ctx, claim.run_id)
        return {**created, "resultType": "task"}

    def _caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        try:
            return self._caller_for(ctx)
        except ToolError as exc:  # no owner on the request, or the server starting or stopping
            raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from None

    async def _task(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> dict[str, Any]:
        try:
            record = await self._caller(ctx).run_record(task_id)
        except NotFoundError:
            # The same reply for a task nobody created and another owner's: nothing to probe.
            raise MCPError(code=INVALID_PARAMS, message=UNKNOWN_TASK.format(task_id=task_id[:80])) from None
        except RlmMcpError as exc:  # an id too long or not text
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        return self._view.of(record)

    async def _checked(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        _require_declared(ctx)
        _check_routing_header(ctx, params.task_id)
        return await self._task(ctx, params.task_id)

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        return {**await self._checked(ctx, params), "resultType": "complete"}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> HandlerResult:
        # A run never asks its client for input (no `input_required`), so there is nothing to
        # resume: the task must exist and be the caller's, and the update is acknowledged.
        await self._checked(ctx, params)
        return {"resultType": "complete"}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        await self._checked(ctx, params)
        try:
            await self._caller(ctx).cancel(params.task_id)  # an ended run: nothing changes
        except NotFoundError:
            raise MCPError(code=INVALID_PARAMS, message=UNKNOWN_TASK.format(task_id=params.task_id[:80])) from None
        return {"resultType": "complete"}


def record_ttl_ms(max_age_days: float) -> int | None:
    """A task's lifetime: as long as its run's record is kept by age (None: kept for ever)."""
    return int(max_age_days * 86_400_000) if max_age_days > 0 else None
