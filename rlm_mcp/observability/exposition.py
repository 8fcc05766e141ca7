"""`GET /metrics`: the Prometheus exposition of this process's metrics, as an ASGI app.

It sits in front of the request guard like `/healthz` (a scraper sends no Host a replica knows),
and checks the bearer token itself: with tokens set, a scrape must send one
(`Authorization: Bearer ...`, Prometheus's `authorization` scrape setting) unless
RLM_MCP_METRICS_PUBLIC=true opens it to anyone who reaches the port (a scraper on a private
network). The text says counts and latencies, never ids, prompts or hosts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from rlm_mcp.access import BearerTokens

__all__ = ["PATH", "metrics_endpoint", "with_metrics", "with_path"]

PATH = "/metrics"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def metrics_endpoint(tokens: Iterable[str], *, public: bool) -> ASGIApp:
    """The app answering `PATH`: 401 without a valid token when tokens are set and not `public`."""
    bearer = BearerTokens([] if public else list(tokens))
    import rlm_mcp.observability.metrics  # noqa: F401  (registers the metrics before any scrape)

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            await _send(send, 405, b"method not allowed\n", [(b"allow", b"GET, HEAD")])
            return
        if bearer and bearer.owner(_header(scope, b"authorization")) is None:
            body = b"/metrics needs the bearer token (or RLM_MCP_METRICS_PUBLIC=true on a private network).\n"
            await _send(send, 401, body, [(b"www-authenticate", b'Bearer realm="rlm-mcp"')])
            return
        # Rendering takes well under a millisecond for this registry: no worker thread needed.
        text = generate_latest(REGISTRY)
        await _send(send, 200, b"" if method == "HEAD" else text, [(b"content-type", CONTENT_TYPE_LATEST.encode())])

    return endpoint


def with_metrics(app: ASGIApp, endpoint: ASGIApp) -> ASGIApp:
    """`app` with `PATH` answered by `endpoint`; everything else goes to `app` untouched."""
    return with_path(app, PATH, endpoint)


def with_path(app: ASGIApp, path: str, endpoint: ASGIApp) -> ASGIApp:
    """`app` with HTTP requests for exactly `path` answered by `endpoint`; everything else (other
    paths, lifespan events) goes to `app` untouched. The one router of the unguarded routes in
    front of the guarded app (this one and the health route, `server.health.with_health`)."""

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == path:
            await endpoint(scope, receive, send)
            return
        await app(scope, receive, send)

    return route


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    base = [(b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]
    if not any(k == b"content-type" for k, _ in headers):
        base.append((b"content-type", b"text/plain; charset=utf-8"))
    await send({"type": "http.response.start", "status": status, "headers": base + headers})
    await send({"type": "http.response.body", "body": body})
