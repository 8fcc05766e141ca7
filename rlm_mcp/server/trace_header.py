"""The server span of each inbound MCP message, and a caller's HTTP `traceparent` header.

`ServerSpans` opens the server span of every inbound message, in place of the SDK's default
`OpenTelemetryMiddleware` (which `build_server` drops): the SDK names the span and sets
`gen_ai.tool.name` from the method and tool name exactly as the client sent them, so any text a
client chose reached the trace store even with message capture off. Here a span is named only
with what the server defines: an MCP method of the protocol and a tool this server declares;
anything else is `_OTHER` (the OpenTelemetry conventions' value for a name off the known list).
A request id is kept when it is a number or a short token, and an exception's message is never
recorded (it may quote the client's arguments). The caller's trace context is continued from
`params._meta.traceparent` (SEP-414, the only carrier over stdio), as a parent only
(`observability/tracing.py`, `sampling.py`).

`HttpTraceContext`, placed first: over HTTP a caller may instead send the W3C `traceparent`
header; it is copied into the message's `_meta` when that carries none, so that the server
span (and every rlm-mcp span below it) joins the caller's trace. Its `tracestate` is not taken.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, get_args

from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, ClientNotification, ClientRequest
from opentelemetry.trace import Span, StatusCode
from opentelemetry.util.types import AttributeValue
from pydantic import ValidationError

from rlm_mcp.observability import tracing

__all__ = ["MCP_METHODS", "OTHER", "HttpTraceContext", "ServerSpans"]

OTHER = "_OTHER"

# Every method a client may send a server, as the protocol's types declare them.
MCP_METHODS = frozenset(
    get_args(message.model_fields["method"].annotation)[0]
    for message in (*get_args(ClientRequest), *get_args(ClientNotification))
)
_PROTOCOL_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class HttpTraceContext(ServerMiddleware[Any]):
    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        meta = ctx.meta
        if meta is None or "traceparent" not in meta:
            headers = getattr(ctx.request, "headers", None)
            parent = headers.get("traceparent") if headers is not None else None
            if parent:
                carried: dict[str, Any] = dict(meta or {})
                carried["traceparent"] = parent
                ctx.meta = carried  # type: ignore[assignment]
        return await call_next(ctx)


class ServerSpans(ServerMiddleware[Any]):
    """The server span of every inbound message, named with the server's own names only."""

    def __init__(self, tool_names: Callable[[], Awaitable[Iterable[str]]]) -> None:
        """`tool_names`: the tools the server declares (asked once, on the first tool call)."""
        self._tool_names = tool_names
        self._tools: frozenset[str] | None = None

    async def _tool(self, params: Mapping[str, Any] | None) -> str:
        if self._tools is None:
            self._tools = frozenset(await self._tool_names())
        name = params.get("name") if params else None
        return name if isinstance(name, str) and name in self._tools else OTHER

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if not tracing.enabled():
            return await call_next(ctx)
        method = ctx.method if ctx.method in MCP_METHODS else OTHER
        name = method
        attributes: dict[str, AttributeValue] = {"mcp.method.name": method}
        version = ctx.protocol_version
        if isinstance(version, str) and _PROTOCOL_VERSION.fullmatch(version):
            attributes["mcp.protocol.version"] = version
        if ctx.request_id is not None:
            attributes["jsonrpc.request.id"] = _request_id(ctx.request_id)
        if method == "tools/call":
            tool = await self._tool(ctx.params)
            name = f"{method} {tool}"
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = tool
        with tracing.server_span(name, attributes, ctx.meta) as span:
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                _failed(span, str(exc.error.code))
                raise
            except ValidationError:  # its message quotes the client's arguments
                _failed(span, str(INVALID_PARAMS))
                raise
            except Exception as exc:
                _failed(span, type(exc).__qualname__, rpc=False)
                raise
            if method == "tools/call" and _tool_error(result):
                _failed(span, "tool_error", rpc=False)
            return result


def _request_id(value: object) -> str:
    text = str(value)
    return text if isinstance(value, int) or _REQUEST_ID.fullmatch(text) else OTHER


def _tool_error(result: object) -> bool:
    """Whether a tool call's result goes out as an error (the model, or the wire's camelCase)."""
    if isinstance(result, CallToolResult):
        return result.is_error is True
    return isinstance(result, Mapping) and result.get("isError") is True


def _failed(span: Span, kind: str, *, rpc: bool = True) -> None:
    span.set_attribute("error.type", kind)
    if rpc:
        span.set_attribute("rpc.response.status_code", kind)
    span.set_status(StatusCode.ERROR)
