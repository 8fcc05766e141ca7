"""An MCP request over the transport's body limit, explained.

The MCP SDK's streamable HTTP transport refuses a request body over its limit with a bare
`413 Request body too large`. A client that sent a large context inline
(`rlm_load_context(text=...)`) learns nothing from that; this middleware, in front of the MCP
app, rewrites that answer into a JSON-RPC error naming the limit and the way round it
(`rlm_upload_context` in chunks, or a path or URL the server loads itself).
"""

from __future__ import annotations

import json

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlm_mcp.store import MAX_CHUNK_BYTES

__all__ = ["OversizeExplained", "oversize_detail"]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def oversize_detail(limit: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> str:
    return (
        f"The request body is over this server's limit of {_mib(limit)} per MCP request "
        "(a context sent inline with rlm_load_context(text=...) counts whole). Send a large context with "
        f"rlm_upload_context in chunks of at most {_mib(MAX_CHUNK_BYTES)}, or load it by path, glob or url."
    )


class OversizeExplained:
    """ASGI middleware: the inner app's 413 answer becomes a JSON-RPC error with the fix."""

    def __init__(self, app: ASGIApp, limit: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> None:
        self._app = app
        self._body = json.dumps(
            {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": oversize_detail(limit)}}
        ).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        rewriting = False

        async def explained(message: Message) -> None:
            nonlocal rewriting
            if message["type"] == "http.response.start" and message.get("status") == 413:
                rewriting = True
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(self._body)).encode())]
                await send({"type": "http.response.start", "status": 413, "headers": headers})
            elif rewriting and message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": self._body})
            else:
                await send(message)

        await self._app(scope, receive, explained)
