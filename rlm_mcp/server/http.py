"""Streamable HTTP transport with bearer-token auth.

Rules (docs/security.md): binding a non-loopback address without a token is refused (a worker's
listener too); whenever tokens are set, every HTTP request on every address must carry one
(`/metrics` checks its own, unless RLM_MCP_METRICS_PUBLIC); Host and Origin are checked against
the actual bind on every bind and every route but `/healthz` (`guard`); sessions are capped per
owner (`sessions`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from rlm_mcp.access import host_policy
from rlm_mcp.assembly import service_parts
from rlm_mcp.config import Settings
from rlm_mcp.observability.exposition import metrics_endpoint, with_metrics
from rlm_mcp.owners import OwnerScope
from rlm_mcp.server.app import build_server
from rlm_mcp.server.connections import uvicorn_config
from rlm_mcp.server.guard import HostGuard, RequestGuard
from rlm_mcp.server.health import health_app, health_endpoint, store_readiness, with_health
from rlm_mcp.server.oversize import OversizeExplained
from rlm_mcp.server.sessions import SessionLimiter
from rlm_mcp.server.start_checks import checked_tokens, refuse_open_bind, roots_for_owners, shares_for_owners
from rlm_mcp.server.ticks import TickingServer
from rlm_mcp.service.service import RlmService
from rlm_mcp.store.bundle import Stores
from rlm_mcp.viewer.auth import ViewerAuth
from rlm_mcp.viewer.path_key import deployment_key, path_key_from
from rlm_mcp.viewer.routes import build_viewer, mount_viewer

logger = logging.getLogger("rlm_mcp.server")


def build_http_app(settings: Settings, *, on_closed: Callable[[], None] | None = None) -> ASGIApp:
    """The MCP app behind `SessionLimiter` (per-owner sessions) and `RequestGuard` (Host, Origin,
    token, owner) — the guard wraps every route the app serves but the health route (`health`)."""
    tokens = checked_tokens(settings)
    settings = shares_for_owners(roots_for_owners(settings, tokens), tokens)
    refuse_open_bind(settings, tokens, serves_mcp=True)
    parts = service_parts(settings, transport="http")  # its stores: opened and closed by the service's lifespan
    stores = parts.stores
    holder: dict[str, RlmService] = {}  # the service while the server runs
    mcp = build_server(settings, mode="http", on_closed=on_closed, parts=parts, holder=holder)
    app: ASGIApp = mcp.streamable_http_app(
        host=settings.server.host,
        # The guard checks Host/Origin for every bind; the SDK's own check covers only three host strings.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        session_idle_timeout=settings.server.http_session_idle_s,
        max_sessions=settings.server.http_sessions_per_client * max(1, len(tokens)),
    )
    app = SessionLimiter(
        app, per_owner=settings.server.http_sessions_per_client, idle_s=settings.server.http_session_idle_s
    )
    policy = host_policy(settings.server)
    # /runs/ (the viewer) has its own door: browsers cannot send a bearer header, so it also takes a
    # cookie from a one-time link; it checks Host and Origin with the same policy as /mcp.
    auth = ViewerAuth(
        tokens=tokens,
        policy=policy,
        path_key=deployment_key(settings.store.data_dir),
        public_url=settings.server.public_url,
        spent=stores.spent_codes,
    )

    async def share_viewer_key() -> None:  # team mode: a login link or cookie works on every replica
        auth.key = await stores.lifecycle.shared_key("viewer")
        if auth.key is not None:  # and the cookie's path is the same on every replica
            auth.path_key = path_key_from(auth.key)

    stores.after_open.append(share_viewer_key)

    async def session_state(session_id: str, owner: OwnerScope) -> dict[str, object] | None:
        service = holder.get("service")
        return await service.session_state(session_id, owner=owner) if service is not None else None

    async def throttle_states() -> list[dict[str, object]]:  # this process's LM limits (lm/throttle.py)
        throttles = getattr(getattr(holder.get("service"), "lm", None), "throttles", None)
        return throttles.view() if throttles is not None else []

    async def follow_progress(run_id: str) -> None:  # an event stream follows the run turn by turn
        service = holder.get("service")
        if service is not None:
            await service.runs.follow_progress(run_id)

    viewer = build_viewer(
        stores.runs,
        auth,
        session_state=session_state,
        events=settings.events,
        webhooks=stores.webhooks,
        throttles=throttle_states,
        follow=follow_progress,
    )
    # /healthz (the balancer's check) is the one route in front of the guard: no token, says little.
    # `role` in team mode only (--role both|front|worker); the embedded server has no roles.
    deployment = settings.deployment
    role = deployment.role if deployment.team else None
    health = health_endpoint(store_readiness(stores), role=role)
    # /metrics checks the token itself (unless RLM_MCP_METRICS_PUBLIC opens it), behind the Host
    # and Origin half of the guard: a scraper names the address it scrapes, which the policy accepts.
    scrape = HostGuard(metrics_endpoint(tokens, public=settings.server.metrics_public), policy)
    return with_metrics(
        with_health(mount_viewer(RequestGuard(OversizeExplained(app), policy, tokens), viewer), health), scrape
    )


def build_worker_app(settings: Settings, stores: Stores) -> ASGIApp:
    """A team worker's listener: `/healthz` (unguarded, for probes) and `/metrics` (behind the
    Host and Origin guard, its own token check); 404 elsewhere. Off loopback it needs tokens."""
    tokens = checked_tokens(settings)
    refuse_open_bind(settings, tokens, serves_mcp=False)
    health = health_app(store_readiness(stores), role="worker")
    scrape = HostGuard(metrics_endpoint(tokens, public=settings.server.metrics_public), host_policy(settings.server))
    return with_metrics(health, scrape)


async def serve_http(settings: Settings, app: ASGIApp | None = None, sock: socket.socket | None = None) -> None:
    """Serve until stopped; `sock` is a listener bound beforehand (`server.listen.bind_listener`),
    so that a port in use is reported before anything starts. Without `app`, the MCP app; with one,
    that app. The start line names what this process's role serves (`served_routes`). uvicorn
    prints one access line per request at INFO (which replica answered what)."""
    app = app or build_http_app(settings)
    owners = len(checked_tokens(settings))
    config = uvicorn_config(
        settings.server, app, owners=owners, log_level=settings.server.log_level.lower(), lifespan="on"
    )
    logger.info("rlm-mcp serving %s", served_routes(settings))
    await TickingServer(config).serve(sockets=[sock] if sock is not None else None)


def served_routes(settings: Settings) -> str:
    """What this process answers over HTTP, for its start line: a worker only its health and
    metrics routes; a front or `both` MCP, the viewer, health and metrics."""
    shown = f"[{settings.server.host}]" if ":" in settings.server.host else settings.server.host
    base = f"http://{shown}:{settings.server.port}"
    if not settings.deployment.serves_mcp:
        return f"only {base}/healthz and {base}/metrics (a team worker: no MCP, no viewer)"
    return f"MCP (streamable HTTP) on {base}/mcp, the viewer on {base}/runs/, {base}/healthz and {base}/metrics"
