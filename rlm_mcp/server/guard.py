"""Who may reach the HTTP server, and as whom (docs/security.md).

`RequestGuard` is an ASGI middleware in front of every route (the MCP endpoint and any other,
e.g. a viewer): it checks the Host and Origin headers against the actual bind (a browser page
on another site must never reach a loopback server: DNS rebinding), then the bearer token when
tokens are configured, and records the request's owner in `scope["state"]["rlm_owner"]`
(Starlette: `request.state.rlm_owner`). The owner is `LOCAL_OWNER` without tokens (one user),
else a stable id derived from the token (never the token itself). The rules themselves (Host and
Origin policy, bearer matching) live in `rlm_mcp.access`, shared with the viewer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from rlm_mcp.access import BearerTokens, HostPolicy
from rlm_mcp.owners import LOCAL_OWNER, Owner

__all__ = ["LOCAL_OWNER", "OWNER_KEY", "RequestGuard", "scope_owner"]

OWNER_KEY = "rlm_owner"


def scope_owner(scope: Scope) -> Owner:
    """The owner the guard recorded for this request (LOCAL_OWNER when there is no guard)."""
    state = scope.get("state") or {}
    owner = state.get(OWNER_KEY)
    return Owner(owner) if isinstance(owner, str) else LOCAL_OWNER


class RequestGuard:
    """ASGI middleware: 421 on a foreign Host, 403 on a foreign Origin, 401 without a valid
    token (when tokens are set); otherwise the owner is recorded and the request passes."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, tokens: Iterable[str]) -> None:
        self._app = app
        self._policy = policy
        self._bearer = BearerTokens(tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events pass through
            await self._app(scope, receive, send)
            return
        headers = _headers(scope)
        if not self._policy.host_ok(headers.get("host", "")):
            await _refuse(send, 421, "misdirected", "The Host header does not name this server (DNS rebinding?).")
            return
        if not self._policy.origin_ok(headers.get("origin")):
            await _refuse(
                send,
                403,
                "forbidden origin",
                "Requests from web pages of other origins are refused; allow one with RLM_MCP_ALLOWED_ORIGINS.",
            )
            return
        owner = self._bearer.owner(headers.get("authorization"))
        if owner is None:
            await _refuse(
                send,
                401,
                "unauthorized",
                "Send Authorization: Bearer <token>.",
                [(b"www-authenticate", b'Bearer realm="rlm-mcp"')],
            )
            return
        scope.setdefault("state", {})[OWNER_KEY] = owner
        await self._app(scope, receive, send)


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope.get("headers") or []:
        out.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return out


async def _refuse(
    send: Send, status: int, error: str, detail: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"error": error, "detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
