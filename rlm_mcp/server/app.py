"""The MCP server: its lifespan (the service), the owner bound to each request, the run tools and
the resources, mapped onto `RlmService`. No logic here beyond argument mapping; the context tools
are `context_tools.py`, and how a failure answers a client (`ToolError`, cause and fix) is
`tool_calls.py`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.types import ToolAnnotations

from rlm_mcp import __version__
from rlm_mcp.assembly import build_service
from rlm_mcp.config import Settings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import to_json
from rlm_mcp.owners import Owner
from rlm_mcp.server.context_tools import add_context_tools
from rlm_mcp.server.guard import LOCAL_OWNER, scope_owner
from rlm_mcp.server.mcp_server import RlmMcpServer
from rlm_mcp.server.run_tools import SessionArgs, run_tool
from rlm_mcp.server.schemas import (
    ContextHandle,
    RunOutcome,
    RunStarted,
    SessionClosed,
    SessionList,
)
from rlm_mcp.server.task_listen import TaskListen
from rlm_mcp.server.tasks import RunTasks, TaskView, record_ttl_ms, task_claim
from rlm_mcp.server.tool_calls import READ, RUN, for_mcp, tool_call
from rlm_mcp.server.trace_header import HttpTraceContext, ServerSpans
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides, WaitS
from rlm_mcp.service.parts import ServiceParts
from rlm_mcp.service.service import Mode, RlmService
from rlm_mcp.service.views import RunSnapshot

T = TypeVar("T")

INSTRUCTIONS = (
    "Recursive Language Model over contexts too large for your window. Store a context once "
    "(rlm_load_context with a path, folder, glob, url or text; rlm_upload_context for chunked "
    "uploads), then ask rlm_complete(query, context_id). For runs longer than your client's "
    "timeout use rlm_start, then rlm_status / rlm_result, and rlm_cancel (clients declaring MCP Tasks get "
    "rlm_complete as a task instead). Several questions about "
    "the same context: pass keep_session=true, then the returned session_id on each follow-up (the "
    "REPL and what the model built in it are kept; rlm_close_session when done)."
)

# String parameters are annotated plain `str` (empty = not given) on purpose: the SDK parses
# JSON-looking strings for any other annotation, which would turn the text '{"a": 1}' into a dict.


def build_server(
    settings: Settings,
    *,
    mode: Mode = "stdio",
    on_closed: Callable[[], None] | None = None,
    parts: ServiceParts | None = None,
    holder: dict[str, RlmService] | None = None,
) -> MCPServer[RlmService]:
    """The MCP server; `on_closed` is called once the service has shut down (runs recorded,
    sandboxes removed). `holder["service"]` is the service while the server runs (the HTTP
    server's viewer asks it what it shows of kept sessions)."""
    holder = {} if holder is None else holder

    @asynccontextmanager
    async def lifespan(_: MCPServer[RlmService]) -> AsyncIterator[RlmService]:
        # Nothing here touches Docker or the LM endpoint: `initialize` must answer at once.
        try:
            async with build_service(settings, mode=mode, parts=parts) as service:
                holder["service"] = service
                try:
                    yield service
                finally:
                    holder.pop("service", None)
        finally:
            if on_closed is not None:
                on_closed()

    def caller_for(request: object) -> Caller:
        """The service as the owner of this request sees it: the one place an owner is bound."""
        try:
            service = holder["service"]
        except KeyError:
            raise ToolError("The server is starting or shutting down; try again in a moment.") from None
        return Caller(service, owner_of(request, mode))

    def svc(ctx: Context) -> Caller:
        return caller_for(ctx.request_context.request)

    view = TaskView(ttl_ms=record_ttl_ms(settings.runs.run_max_age_days), max_chars=settings.loop.answer_max_chars)
    tasks = RunTasks(lambda ctx: caller_for(ctx.request), view)
    bus = InMemorySubscriptionBus()
    mcp = RlmMcpServer(
        "rlm-mcp",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        extensions=[tasks],
        subscriptions=bus,
    )
    mcp.listen_with(TaskListen(bus, lambda ctx: caller_for(ctx.request), view))
    # The SDK's span per message named it with whatever the client sent: ours names it with the
    # server's own names (server/trace_header.py), after an HTTP traceparent header became _meta.
    mcp.middleware[:] = [m for m in mcp.middleware if not isinstance(m, OpenTelemetryMiddleware)]
    mcp.middleware[:0] = [HttpTraceContext(), ServerSpans(lambda: _tool_names(mcp))]

    add_context_tools(mcp, svc)
    _add_run_tools(mcp, svc, settings)
    _add_resources(mcp, svc)
    return mcp


async def _tool_names(mcp: MCPServer[RlmService]) -> list[str]:
    return [tool.name for tool in await mcp.list_tools()]


def request_owner(ctx: Context, mode: Mode) -> Owner:
    """The owner the HTTP guard recorded for this request (`server.guard`); over stdio, the one
    local user. Over HTTP a request without one is refused rather than treated as local."""
    return owner_of(ctx.request_context.request, mode)


def _has_progress_token(ctx: Context) -> bool:
    """Whether the call asked for progress notifications (its `_meta.progressToken`)."""
    meta = ctx.request_context.meta
    return meta is not None and meta.get("progress_token") is not None


def owner_of(request: object, mode: Mode) -> Owner:
    """`request_owner` of the transport's request object (a tool's or an extension method's)."""
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict) and isinstance((scope.get("state") or {}).get("rlm_owner"), str):
        return scope_owner(scope)
    if mode == "http":
        raise ToolError("This request carries no authenticated owner; send it through the server's HTTP endpoint.")
    return LOCAL_OWNER


def _add_run_tools(mcp: MCPServer[RlmService], svc: Callable[[Context], Caller], settings: Settings) -> None:
    async def start(
        ctx: Context, query: str, context_id: str | list[str] | None, overrides: RunOverrides, session: SessionArgs
    ) -> ActiveRun:
        # The one way a tool starts a run without waiting (rlm_start, and rlm_complete asked as a
        # task): every session argument goes with it, webhook_url included.
        return await tool_call(
            svc(ctx).start_run(
                query,
                context_id,
                overrides,
                keep_session=session.keep_session,
                session_id=session.session_id,
                webhook_url=session.webhook_url,
            )
        )

    @mcp.tool(annotations=RUN)
    @run_tool
    async def rlm_complete(
        ctx: Context, query: str, context_id: str | list[str] | None, overrides: RunOverrides, session: SessionArgs
    ) -> RunOutcome:
        """Answer `query` over a stored context with a Recursive Language Model (waits for the
        answer; sends progress). Runs take minutes: if your client gives up on long calls use
        rlm_start + rlm_result; a client declaring MCP Tasks gets a task to poll instead. Expect
        follow-up questions on the same context? Pass keep_session=true, then session_id on the
        next call: the REPL and everything computed in it are kept."""

        if (claim := task_claim()) is not None:  # asked for as a task (server/tasks.py): start, don't wait
            run = await start(ctx, query, context_id, overrides, session)
            claim.run_id = run.run_id
            return RunOutcome(status="running", run_id=run.run_id, session_id=run.request.session_id)

        async def report(progress: float, total: float | None, message: str) -> None:
            await ctx.report_progress(progress, total, message)

        work = svc(ctx).complete_in_session(
            query,
            context_id,
            overrides,
            report,
            keep_session=session.keep_session,
            session_id=session.session_id,
            webhook_url=session.webhook_url,
            follow_progress=_has_progress_token(ctx),
        )
        result, session_id = await tool_call(work)
        return RunOutcome.of(result, max_chars=settings.loop.answer_max_chars, session_id=session_id)

    @mcp.tool(annotations=RUN)
    @run_tool
    async def rlm_start(
        ctx: Context, query: str, context_id: str | list[str] | None, overrides: RunOverrides, session: SessionArgs
    ) -> RunStarted:
        """Start a run in the background and return its run_id at once: for clients that give up on
        long calls (then rlm_result with wait_s, rlm_status, rlm_cancel). keep_session / session_id
        as in rlm_complete."""
        run = await start(ctx, query, context_id, overrides, session)
        return RunStarted(run_id=run.run_id, status="running", session_id=run.request.session_id)

    @mcp.tool(annotations=READ)
    async def rlm_list_sessions(ctx: Context) -> SessionList:
        """Your kept sessions (keep_session=true): their runs, contexts, size and age."""
        return SessionList(sessions=await tool_call(svc(ctx).list_sessions()))

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False))
    async def rlm_close_session(session_id: str, ctx: Context) -> SessionClosed:
        """End a kept session and release its sandbox (its variables are gone; its runs stay readable)."""
        closed = await tool_call(svc(ctx).close_session(session_id))
        runs = closed.get("runs")
        return SessionClosed(
            session_id=session_id, closed=True, runs=[str(r) for r in runs] if isinstance(runs, list) else []
        )

    @mcp.tool(annotations=READ)
    async def rlm_status(run_id: str, ctx: Context) -> RunSnapshot:
        """Status of a run: turn, sub-calls, tokens, elapsed time."""
        return await tool_call(svc(ctx).status(run_id))

    @mcp.tool(annotations=READ)
    async def rlm_result(
        run_id: str,
        ctx: Context,
        wait_s: WaitS = 0.0,
    ) -> RunOutcome:
        """The result of a run (status 'running' while it still runs)."""
        outcome = await tool_call(svc(ctx).result(run_id, wait_s))
        if isinstance(outcome, RunSnapshot):
            return RunOutcome.pending(outcome)
        return RunOutcome.of(outcome, max_chars=settings.loop.answer_max_chars)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
    async def rlm_cancel(run_id: str, ctx: Context) -> RunSnapshot:
        """Cancel a run: stops its LM calls and removes its sandboxes."""
        return await tool_call(svc(ctx).cancel(run_id))


def _add_resources(mcp: MCPServer[RlmService], svc: Callable[[Context], Caller]) -> None:
    async def read(work: Awaitable[T]) -> T:
        try:
            return await work
        except RlmMcpError as exc:
            raise ResourceError(for_mcp(exc)) from exc

    @mcp.resource("rlm://contexts/{context_id}", mime_type="application/json")
    async def context_resource(context_id: str, ctx: Context) -> str:
        """Metadata of a stored context (not its body)."""
        info = await read(svc(ctx).context(context_id))
        return ContextHandle.of(info).model_dump_json(indent=2)

    @mcp.resource("rlm://runs/{run_id}", mime_type="application/json")
    async def run_resource(run_id: str, ctx: Context) -> str:
        """Summary of a run: query, limits, status, result."""
        record = await read(svc(ctx).run_record(run_id))
        return json.dumps(record.to_stored(), indent=2)

    @mcp.resource("rlm://runs/{run_id}/trajectory", mime_type="application/jsonl")
    async def trajectory_resource(run_id: str, ctx: Context) -> str:
        """The run's event log (JSONL): turns, cells, LM calls, end."""
        events = await read(svc(ctx).run_events(run_id))
        return "\n".join(json.dumps(to_json(e), default=str) for e in events) + ("\n" if events else "")

    @mcp.resource("rlm://sessions/{session_id}", mime_type="application/json")
    async def session_resource(session_id: str, ctx: Context) -> str:
        """A kept session: its runs (in order), contexts, size and age."""
        return json.dumps(await read(svc(ctx).session(session_id)), indent=2)

    @mcp.resource("rlm://runs/{run_id}/answer", mime_type="text/plain")
    async def answer_resource(run_id: str, ctx: Context) -> str:
        """The full answer of a finished run."""
        return await read(svc(ctx).full_answer(run_id))
