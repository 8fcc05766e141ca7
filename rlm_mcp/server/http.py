"""Streamable HTTP transport with bearer-token auth.

Rules (README, "Security model"): binding a non-loopback address without a token is refused; whenever tokens
are set, every HTTP request on every address must carry one; Host and Origin are checked against
the actual bind on every bind (`guard`); sessions are capped per owner (`sessions`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from rlm_mcp.access import HostPolicy, is_loopback_host, load_tokens
from rlm_mcp.config import Settings
from rlm_mcp.errors import AccessDeniedError
from rlm_mcp.server.app import build_server
from rlm_mcp.server.guard import RequestGuard
from rlm_mcp.server.sessions import SessionLimiter
from rlm_mcp.store import RunStore
from rlm_mcp.viewer.auth import ViewerAuth
from rlm_mcp.viewer.routes import build_viewer, mount_viewer

logger = logging.getLogger("rlm_mcp.server")


def build_http_app(settings: Settings, *, on_closed: Callable[[], None] | None = None) -> ASGIApp:
    """The MCP app behind `SessionLimiter` (per-owner sessions) and `RequestGuard` (Host, Origin,
    token, owner) — the guard wraps every route the app serves."""
    try:
        tokens = load_tokens(settings)
    except OSError as exc:
        raise AccessDeniedError(
            f"The tokens file {settings.auth_tokens_file} cannot be read ({exc.strerror}).",
            "Fix RLM_MCP_AUTH_TOKENS_FILE, or unset it.",
        ) from None
    if not is_loopback_host(settings.host) and not tokens:
        raise AccessDeniedError(
            f"Refusing to serve HTTP on {settings.host} without a token: anyone who can reach it could run code.",
            "Set RLM_MCP_AUTH_TOKEN (clients then send Authorization: Bearer <token>), or bind 127.0.0.1.",
        )
    mcp = build_server(settings, mode="http", on_closed=on_closed)
    app: ASGIApp = mcp.streamable_http_app(
        host=settings.host,
        # The guard checks Host/Origin for every bind; the SDK's own check covers only three host strings.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        session_idle_timeout=settings.http_session_idle_s,
        max_sessions=settings.http_sessions_per_client * max(1, len(tokens)),
    )
    app = SessionLimiter(app, per_owner=settings.http_sessions_per_client, idle_s=settings.http_session_idle_s)
    policy = HostPolicy(settings.host, settings.port, settings.allowed_hosts, settings.allowed_origins)
    # /runs/ (the viewer) has its own door: browsers cannot send a bearer header, so it also takes a
    # cookie from a one-time link; it checks Host and Origin with the same policy as /mcp.
    viewer = build_viewer(RunStore(settings), ViewerAuth(tokens=tokens, policy=policy))
    return mount_viewer(RequestGuard(app, policy, tokens), viewer)


async def serve_http(settings: Settings, app: ASGIApp | None = None) -> None:
    app = app or build_http_app(settings)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(), lifespan="on"
    )
    logger.info("rlm-mcp serving streamable HTTP on http://%s:%d/mcp", settings.host, settings.port)
    await uvicorn.Server(config).serve()
