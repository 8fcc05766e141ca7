"""Who may reach the HTTP server, and as whom (docs/security.md).

`RequestGuard` is an ASGI middleware in front of every route (the MCP endpoint and any other,
e.g. a viewer): it checks the Host and Origin headers against the actual bind (a browser page
on another site must never reach a loopback server: DNS rebinding), then the bearer token when
tokens are configured, and records the request's owner in `scope["state"]["rlm_owner"]`
(Starlette: `request.state.rlm_owner`). The owner is `LOCAL_OWNER` without tokens (one user),
else a stable id derived from the token (never the token itself). The rules themselves (Host and
Origin policy, bearer matching) live in `rlm_mcp.access`, shared with the viewer.

`HostGuard` is the first half alone (Host and Origin, no token): what `/metrics` sits behind,
since it checks its own token (or is public by RLM_MCP_METRICS_PUBLIC) but must never answer a
page that rebound a name to a loopback server.

The usual cause of a 421 is not an attack but a proxy or balancer forwarding the name clients
use, which the replica was never told: the refusal and the log say which setting names it
(RLM_MCP_PUBLIC_URL), once per refused name so a flood of them cannot fill the log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from rlm_mcp.access import BearerTokens, HostPolicy
from rlm_mcp.owners import LOCAL_OWNER, Owner

__all__ = ["LOCAL_OWNER", "MISDIRECTED", "OWNER_KEY", "HostGuard", "RequestGuard", "scope_owner"]

OWNER_KEY = "rlm_owner"
MISDIRECTED = (
    "The Host header does not name this server (DNS rebinding?). Behind a proxy or load balancer, set "
    "RLM_MCP_PUBLIC_URL=https://the-public-host (the name clients use) on every replica, or add an internal "
    "name to RLM_MCP_ALLOWED_HOSTS."
)
LOGGED_NAMES = 64  # refused Host names logged, each once: a flood of names cannot fill the log

log = logging.getLogger("rlm_mcp.server")


def scope_owner(scope: Scope) -> Owner:
    """The owner the guard recorded for this request (LOCAL_OWNER when there is no guard)."""
    state = scope.get("state") or {}
    owner = state.get(OWNER_KEY)
    return Owner(owner) if isinstance(owner, str) else LOCAL_OWNER


class HostGuard:
    """ASGI middleware: 421 on a foreign Host, 403 on a foreign Origin; otherwise the request
    passes (no token checked: the app behind it does that, or is open by design)."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self._app = app
        self._policy = policy
        self._logged: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events pass through
            await self._app(scope, receive, send)
            return
        if await self.refused(scope, send):
            return
        await self._app(scope, receive, send)

    async def refused(self, scope: Scope, send: Send) -> bool:
        """Answer 421 or 403 and say True when Host or Origin is foreign."""
        headers = _headers(scope)
        host = headers.get("host", "")
        if not self._policy.host_ok(host):
            self._log_misdirected(host)
            await _refuse(send, 421, "misdirected", MISDIRECTED)
            return True
        if not self._policy.origin_ok(headers.get("origin")):
            await _refuse(
                send,
                403,
                "forbidden origin",
                "Requests from web pages of other origins are refused; allow one with RLM_MCP_ALLOWED_ORIGINS.",
            )
            return True
        return False

    def _log_misdirected(self, host: str) -> None:
        shown = host[:200]
        if shown in self._logged or len(self._logged) >= LOGGED_NAMES:
            return
        self._logged.add(shown)
        log.warning(
            "refused a request for Host %r (421): if clients reach this server through a proxy or load balancer "
            "by that name, set RLM_MCP_PUBLIC_URL=https://%s (or list an internal name in RLM_MCP_ALLOWED_HOSTS); "
            "otherwise a web page may be trying DNS rebinding",
            shown,
            shown.encode("ascii", "replace").decode() or "the-public-host",
        )


class RequestGuard:
    """ASGI middleware: 421 on a foreign Host, 403 on a foreign Origin (`HostGuard`), 401 without
    a valid token (when tokens are set); otherwise the owner is recorded and the request passes."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, tokens: Iterable[str]) -> None:
        self._app = app
        self._hosts = HostGuard(app, policy)
        self._bearer = BearerTokens(tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events pass through
            await self._app(scope, receive, send)
            return
        if await self._hosts.refused(scope, send):
            return
        owner = self._bearer.owner(_headers(scope).get("authorization"))
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
