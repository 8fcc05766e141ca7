"""The MCP surface: tool and resource declarations mapped onto `RlmService`. No logic here
beyond argument mapping and turning `RlmMcpError`s into `ToolError`s (their text is written
for the person reading the client)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, TypeVar

import anyio
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.types import ToolAnnotations
from pydantic import Field

from rlm_mcp import __version__
from rlm_mcp.assembly import build_service
from rlm_mcp.config import Settings
from rlm_mcp.errors import RlmMcpError, UnknownIdError
from rlm_mcp.events import to_json
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.resource_errors import exhausted
from rlm_mcp.server.guard import LOCAL_OWNER, scope_owner
from rlm_mcp.server.mcp_server import RlmMcpServer
from rlm_mcp.server.run_tools import SessionArgs, run_tool
from rlm_mcp.server.schemas import (
    ContextHandle,
    ContextList,
    Deleted,
    RunOutcome,
    RunStarted,
    SessionClosed,
    SessionList,
    UploadProgress,
)
from rlm_mcp.server.task_listen import TaskListen
from rlm_mcp.server.tasks import RunTasks, TaskView, record_ttl_ms, task_claim
from rlm_mcp.server.trace_header import HttpTraceContext, ServerSpans
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.caller import Caller, ChunkEncoding
from rlm_mcp.service.limits import RunOverrides, WaitS
from rlm_mcp.service.parts import ServiceParts
from rlm_mcp.service.progress import HEARTBEAT_S
from rlm_mcp.service.service import Mode, RlmService
from rlm_mcp.service.views import RunSnapshot

T = TypeVar("T")
logger = logging.getLogger("rlm_mcp.server")

INSTRUCTIONS = (
    "Recursive Language Model over contexts too large for your window. Store a context once "
    "(rlm_load_context with a path, folder, glob, url or text; rlm_upload_context for chunked "
    "uploads), then ask rlm_complete(query, context_id). For runs longer than your client's "
    "timeout use rlm_start, then rlm_status / rlm_result, and rlm_cancel (clients declaring MCP Tasks get "
    "rlm_complete as a task instead). Several questions about "
    "the same context: pass keep_session=true, then the returned session_id on each follow-up (the "
    "REPL and what the model built in it are kept; rlm_close_session when done)."
)

_READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_STORE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
_RUN = ToolAnnotations(read_only_hint=True, idempotent_hint=False, open_world_hint=True)

# How an MCP client's user fixes an unknown id (the store only says which id was unknown).
MCP_FIXES = {
    "context": "Call rlm_list_contexts to see stored contexts, or load one with rlm_load_context.",
    "run": "Use a run_id returned by rlm_start or rlm_complete.",
    "upload": "Start the upload again: send chunk index 0 without an upload_id.",
}


def for_mcp(exc: RlmMcpError) -> str:
    """The error's text for an MCP client."""
    return str(exc.phrased(MCP_FIXES) if isinstance(exc, UnknownIdError) else exc)


async def _call(work: Awaitable[T]) -> T:
    try:
        return await work
    except RlmMcpError as exc:
        raise ToolError(for_mcp(exc)) from exc
    except ToolError:
        raise
    except Exception as exc:
        if (phrased := exhausted(exc)) is not None:  # a full disk, a quota, no descriptors left
            logger.warning("%s", phrased)
            raise ToolError(str(phrased)) from exc
        # Last line of defence: a bug must still answer as a tool error (the caller learns
        # what happened, the server keeps serving), and leave its traceback in the log.
        logger.exception("internal error in a tool call")
        raise ToolError(
            f"Internal error in rlm-mcp ({type(exc).__name__}); the server is still running. "
            "Report it with the server log; meanwhile check the arguments or try again."
        ) from exc


async def _with_heartbeat(ctx: Context, label: str, work: Awaitable[T]) -> T:
    """Await `work`, sending a progress line every few seconds (a big folder or a slow URL
    must not look like a hang, and clients that reset their timeout on progress need it)."""

    async def beat() -> None:
        started = anyio.current_time()
        while True:
            await anyio.sleep(HEARTBEAT_S)
            elapsed = anyio.current_time() - started
            await ctx.report_progress(elapsed, None, f"{label} · {elapsed:.0f} s")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat)
            try:
                result = await work
            finally:
                tg.cancel_scope.cancel()
    except* Exception as group:
        # The task group wraps the failure in a group; the caller phrases the error itself.
        raise group.exceptions[0] from None
    return result


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

    _add_context_tools(mcp, svc)
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


def _add_context_tools(mcp: MCPServer[RlmService], svc: Callable[[Context], Caller]) -> None:
    @mcp.tool(annotations=_STORE)
    async def rlm_load_context(
        ctx: Context,
        text: Annotated[str, Field(description="The context itself (small contexts only).")] = "",
        path: Annotated[str, Field(description="A file or folder under the allowed roots.")] = "",
        glob: Annotated[str, Field(description="An absolute glob pattern, e.g. /repo/**/*.py.")] = "",
        url: Annotated[str, Field(description="An http(s) URL to fetch.")] = "",
        name: Annotated[str, Field(description="A label shown in rlm_list_contexts.")] = "",
        format: Annotated[ContextFormat, Field(description="json: the sandbox sees a list/dict.")] = "text",
        include: Annotated[list[str] | None, Field(description="Folder/glob: only paths matching these.")] = None,
        exclude: Annotated[list[str] | None, Field(description="Folder/glob: skip paths matching these.")] = None,
    ) -> ContextHandle:
        """Store a large context once and get a context_id handle (same bytes, same id)."""
        source = path or glob or url or "text"
        work = svc(ctx).load_context(
            text=text or None,
            path=path or None,
            glob=glob or None,
            url=url or None,
            name=name or None,
            format=format,
            include=include,
            exclude=exclude,
        )
        info = await _call(_with_heartbeat(ctx, f"loading {source[:120]}", work))
        return ContextHandle.of(info)

    @mcp.tool(annotations=_STORE)
    async def rlm_upload_context(
        ctx: Context,
        data: Annotated[str, Field(description="This chunk: at most 1 MiB once decoded.")],
        index: Annotated[int, Field(ge=0, description="0 for the first chunk, then 1, 2, ...")],
        upload_id: Annotated[str, Field(description="From the answer to chunk 0; omit on chunk 0.")] = "",
        final: Annotated[bool, Field(description="True on the last chunk: the context is stored.")] = False,
        encoding: Annotated[ChunkEncoding, Field(description="How `data` is encoded.")] = "text",
        sha256: Annotated[str, Field(description="Hex SHA-256 of the whole upload, checked at the end.")] = "",
        name: Annotated[str, Field(description="A label for the context.")] = "",
        format: Annotated[ContextFormat | None, Field(description="text (default) or json.")] = None,
    ) -> UploadProgress:
        """Upload a context in chunks (resumable); the final chunk returns the context handle."""
        state = await _call(
            svc(ctx).upload_chunk(
                data=data,
                index=index,
                upload_id=upload_id or None,
                final=final,
                encoding=encoding,
                sha256=sha256 or None,
                name=name or None,
                format=format,
            )
        )
        return UploadProgress.of(state)

    @mcp.tool(annotations=_READ)
    async def rlm_list_contexts(ctx: Context) -> ContextList:
        """List stored contexts."""
        infos = await _call(svc(ctx).list_contexts())
        return ContextList(contexts=[ContextHandle.of(i) for i in infos])

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
    async def rlm_delete_context(context_id: str, ctx: Context) -> Deleted:
        """Delete a stored context."""
        deleted = await _call(svc(ctx).delete_context(context_id))
        return Deleted(context_id=context_id, deleted=deleted)


def _add_run_tools(mcp: MCPServer[RlmService], svc: Callable[[Context], Caller], settings: Settings) -> None:
    async def start(
        ctx: Context, query: str, context_id: str | list[str] | None, overrides: RunOverrides, session: SessionArgs
    ) -> ActiveRun:
        # The one way a tool starts a run without waiting (rlm_start, and rlm_complete asked as a
        # task): every session argument goes with it, webhook_url included.
        return await _call(
            svc(ctx).start_run(
                query,
                context_id,
                overrides,
                keep_session=session.keep_session,
                session_id=session.session_id,
                webhook_url=session.webhook_url,
            )
        )

    @mcp.tool(annotations=_RUN)
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
        result, session_id = await _call(work)
        return RunOutcome.of(result, max_chars=settings.loop.answer_max_chars, session_id=session_id)

    @mcp.tool(annotations=_RUN)
    @run_tool
    async def rlm_start(
        ctx: Context, query: str, context_id: str | list[str] | None, overrides: RunOverrides, session: SessionArgs
    ) -> RunStarted:
        """Start a run in the background and return its run_id at once: for clients that give up on
        long calls (then rlm_result with wait_s, rlm_status, rlm_cancel). keep_session / session_id
        as in rlm_complete."""
        run = await start(ctx, query, context_id, overrides, session)
        return RunStarted(run_id=run.run_id, status="running", session_id=run.request.session_id)

    @mcp.tool(annotations=_READ)
    async def rlm_list_sessions(ctx: Context) -> SessionList:
        """Your kept sessions (keep_session=true): their runs, contexts, size and age."""
        return SessionList(sessions=await _call(svc(ctx).list_sessions()))

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False))
    async def rlm_close_session(session_id: str, ctx: Context) -> SessionClosed:
        """End a kept session and release its sandbox (its variables are gone; its runs stay readable)."""
        closed = await _call(svc(ctx).close_session(session_id))
        runs = closed.get("runs")
        return SessionClosed(
            session_id=session_id, closed=True, runs=[str(r) for r in runs] if isinstance(runs, list) else []
        )

    @mcp.tool(annotations=_READ)
    async def rlm_status(run_id: str, ctx: Context) -> RunSnapshot:
        """Status of a run: turn, sub-calls, tokens, elapsed time."""
        return await _call(svc(ctx).status(run_id))

    @mcp.tool(annotations=_READ)
    async def rlm_result(
        run_id: str,
        ctx: Context,
        wait_s: WaitS = 0.0,
    ) -> RunOutcome:
        """The result of a run (status 'running' while it still runs)."""
        outcome = await _call(svc(ctx).result(run_id, wait_s))
        if isinstance(outcome, RunSnapshot):
            return RunOutcome.pending(outcome)
        return RunOutcome.of(outcome, max_chars=settings.loop.answer_max_chars)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
    async def rlm_cancel(run_id: str, ctx: Context) -> RunSnapshot:
        """Cancel a run: stops its LM calls and removes its sandboxes."""
        return await _call(svc(ctx).cancel(run_id))


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
