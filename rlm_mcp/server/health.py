"""`GET /healthz`: the unauthenticated route a load balancer (or systemd, or Kubernetes) checks.

It answers 200 with `{"status": "ok", "version": ..., "role": ..., "database": "reachable"}`
while this process can serve, and 503 with `"status": "unavailable"` when it cannot (team mode:
its PostgreSQL is unreachable, `"database": "unreachable"`, or refused a statement for lack of
disk or memory within the last 30 s, `"database": "disk full"` or `"out of memory"`: reads still
work then, writes do not, and the logs and the tools' errors say what to free). `role` appears when the process knows it; `database` only in
team mode. With a bucket (RLM_MCP_BLOB_URL), `blobs` says `"ok"`, or what its requests failed with
in the last 30 s and none succeeded since: `"unreachable"`, `"refused"` (credentials, policy) or
`"full"` (a quota). A bucket fault leaves the answer 200: every replica shares the bucket, so
taking this one out of the balancer helps no caller, and runs on contexts a worker has cached
still run; it is there for monitoring (and the log says it once per change). Nothing else is
said: no host names, no database URL, no bucket name, no error text, no counts.

Why no token and no Host check: a balancer's probe carries neither a bearer token nor a name
the replica would know (HAProxy sends none by default, Kubernetes sends the pod's IP). What the
route tells is only that a server of this version is up, so it is safe to answer anyone; the
other routes keep their guard (`guard.RequestGuard`), which this route bypasses alone.

Why it costs almost nothing: the readiness check (team mode: a `SELECT 1`, unless a statement of
the pool answered within the last 2.5 s, `store.pg.lending.ANSWERED_S`) runs at most once per
`CACHE_S`, whatever the number of callers; concurrent callers wait for the one in flight, and the
check gives up after `CHECK_TIMEOUT_S`.

A worker-only process (no MCP, no viewer) serves `health_app(check)` alone; the HTTP server
puts `with_health(app, endpoint)` in front of its guarded app.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from rlm_mcp import __version__
from rlm_mcp.observability.exposition import with_path
from rlm_mcp.store.bundle import Stores

__all__ = [
    "CACHE_S",
    "CHECK_TIMEOUT_S",
    "PATH",
    "Readiness",
    "ReadinessCheck",
    "health_app",
    "health_endpoint",
    "store_readiness",
    "with_health",
]

PATH = "/healthz"
CACHE_S = 1.0
CHECK_TIMEOUT_S = 3.0

log = logging.getLogger("rlm_mcp.server")


@dataclass(frozen=True)
class Readiness:
    """Whether this process can serve. `database`: None without one (the embedded store)."""

    ready: bool
    database: bool | None = None
    fault: str | None = None  # "disk full", "out of memory": the database refuses writes
    blobs: str | None = None  # with a bucket: "ok", "unreachable", "refused", "full" (never 503)


ReadinessCheck = Callable[[], Awaitable[Readiness]]


def store_readiness(stores: Stores) -> ReadinessCheck:
    """Ready when the store answers: always for the embedded store, a `SELECT 1` in team mode;
    with what the bucket last said beside it (never a reason for 503)."""

    async def check() -> Readiness:
        blobs = None if stores.blob_fault is None else (stores.blob_fault() or "ok")
        reachable = await stores.lifecycle.ping()
        if reachable is None:
            return Readiness(ready=True, blobs=blobs)
        fault = stores.lifecycle.fault() if reachable else None
        return Readiness(ready=reachable and fault is None, database=reachable, fault=fault, blobs=blobs)

    return check


class _Cached:
    """One check at a time, its answer reused for `ttl` seconds; a failing or slow check is
    'not ready' (and logged once per change, not per probe)."""

    def __init__(self, check: ReadinessCheck, ttl: float) -> None:
        self._check = check
        self._ttl = ttl
        self._lock = anyio.Lock()
        self._value: Readiness | None = None
        self._at = 0.0

    async def get(self) -> Readiness:
        async with self._lock:
            if self._value is None or anyio.current_time() - self._at >= self._ttl:
                value = await self._run()
                if self._value is not None and (value.ready, value.fault) != (self._value.ready, self._value.fault):
                    if value.ready:
                        log.info("health: this replica is ready again (200)")
                    else:
                        why = (
                            f"its database is {value.fault}"
                            if value.fault
                            else "its database is unreachable"
                            if value.database is False
                            else "its readiness check failed"
                        )
                        log.warning("health: this replica now answers 503 (%s): balancers take it out", why)
                if self._value is not None and value.blobs != self._value.blobs and value.blobs is not None:
                    if value.blobs == "ok":
                        log.info("health: the bucket answers again")
                    else:
                        log.warning("health: the bucket is %s (runs on cached contexts still run)", value.blobs)
                self._value, self._at = value, anyio.current_time()
            return self._value

    async def _run(self) -> Readiness:
        try:
            with anyio.fail_after(CHECK_TIMEOUT_S):
                return await self._check()
        except TimeoutError:
            return Readiness(ready=False)
        except Exception:
            log.debug("health check failed", exc_info=True)
            return Readiness(ready=False)


def health_endpoint(check: ReadinessCheck, *, role: str | None = None, cache_s: float = CACHE_S) -> ASGIApp:
    """The ASGI app answering the health route (GET or HEAD; any other method: 405)."""
    cached = _Cached(check, cache_s)

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            await _respond(send, 405, {"error": "method not allowed"}, extra=[(b"allow", b"GET, HEAD")])
            return
        readiness = await cached.get()
        body: dict[str, object] = {"status": "ok" if readiness.ready else "unavailable", "version": __version__}
        if role is not None:
            body["role"] = role
        if readiness.fault is not None:
            body["database"] = readiness.fault
        elif readiness.database is not None:
            body["database"] = "reachable" if readiness.database else "unreachable"
        if readiness.blobs is not None:
            body["blobs"] = readiness.blobs
        await _respond(send, 200 if readiness.ready else 503, body, head=method == "HEAD")

    return endpoint


def with_health(app: ASGIApp, endpoint: ASGIApp) -> ASGIApp:
    """`app` with the health route in front: exactly `PATH` goes to `endpoint`, unguarded;
    everything else (other paths, lifespan events) goes to `app` untouched."""
    return with_path(app, PATH, endpoint)


def health_app(check: ReadinessCheck, *, role: str | None = None, cache_s: float = CACHE_S) -> ASGIApp:
    """An app serving only the health route (404 elsewhere): what a worker-only process serves."""

    async def nothing_else(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # no startup work of its own
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] == "http":
            await _respond(send, 404, {"error": "not found", "detail": f"This process serves only {PATH}."})

    return with_health(nothing_else, health_endpoint(check, role=role, cache_s=cache_s))


async def _respond(
    send: Send,
    status: int,
    payload: dict[str, object],
    *,
    head: bool = False,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": b"" if head else body})
