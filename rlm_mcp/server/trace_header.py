"""A caller's HTTP `traceparent` header, continued like `params._meta.traceparent`.

The MCP SDK's default `OpenTelemetryMiddleware` opens the server span of each inbound message
and continues the trace context it finds in `_meta` (SEP-414, the only carrier over stdio).
Over HTTP a caller may instead send the W3C `traceparent` (and `tracestate`) header; this
middleware, placed before the SDK's, copies them into the message's `_meta` when it carries
none, so that the SDK's span (and every rlm-mcp span below it) joins the caller's trace.
It opens no span of its own.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext

__all__ = ["HttpTraceContext"]

_HEADERS = ("traceparent", "tracestate")


class HttpTraceContext(ServerMiddleware[Any]):
    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        meta = ctx.meta
        if meta is None or "traceparent" not in meta:
            headers = getattr(ctx.request, "headers", None)
            found = {name: headers.get(name) for name in _HEADERS} if headers is not None else {}
            if found.get("traceparent"):
                carried: dict[str, Any] = dict(meta or {})
                carried.update({name: value for name, value in found.items() if value})
                ctx.meta = carried  # type: ignore[assignment]
        return await call_next(ctx)
