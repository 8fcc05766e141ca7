"""How a tool call answers: a failure as the `ToolError` its client reads (cause and fix, an
unknown id phrased for an MCP client), a slow call with a progress line every few seconds, and
the hints each kind of tool declares."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from rlm_mcp.errors import RlmMcpError, UnknownIdError
from rlm_mcp.resource_errors import exhausted
from rlm_mcp.service.progress import HEARTBEAT_S

T = TypeVar("T")
logger = logging.getLogger("rlm_mcp.server")

# The tools' hints to a client: what reads, what stores (idempotently), what runs a model.
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
STORE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
RUN = ToolAnnotations(read_only_hint=True, idempotent_hint=False, open_world_hint=True)

# How an MCP client's user fixes an unknown id (the store only says which id was unknown).
MCP_FIXES = {
    "context": "Call rlm_list_contexts to see stored contexts, or load one with rlm_load_context.",
    "run": "Use a run_id returned by rlm_start or rlm_complete.",
    "upload": "Start the upload again: send chunk index 0 without an upload_id.",
}


def for_mcp(exc: RlmMcpError) -> str:
    """The error's text for an MCP client."""
    return str(exc.phrased(MCP_FIXES) if isinstance(exc, UnknownIdError) else exc)


async def tool_call(work: Awaitable[T]) -> T:
    """Await a tool's work, its failures as the `ToolError` the client reads (cause and fix)."""
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


async def with_heartbeat(ctx: Context, label: str, work: Awaitable[T]) -> T:
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
