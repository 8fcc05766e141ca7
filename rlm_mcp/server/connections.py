"""Connections the HTTP server holds before anyone has proved who they are.

uvicorn arms no timer until a response is complete, so a client that connects and then sends
nothing, or stops in the middle of its headers (slowloris), holds a socket and a file descriptor
forever; about a thousand of them exhaust a 1,024-fd process (and then SQLite, Docker and run
logs fail too). Here:

- every request's headers must arrive within `RLM_MCP_HTTP_HEADER_TIMEOUT_S`, counted from the
  connection (first request) or from the request's first byte (later requests on a keep-alive
  connection); a connection that misses it is closed;
- open connections are bounded (`RLM_MCP_HTTP_MAX_CONNECTIONS`, by default derived from the
  session caps: every owner's sessions may each hold a long-lived SSE stream and a request in
  flight, plus room for viewer pages and new clients); a connection over the bound is closed at
  once, so a flood costs the server no descriptor;
- the process's soft fd limit is raised to its hard limit at start;
- an idle keep-alive connection is closed after `RLM_MCP_HTTP_KEEP_ALIVE_S`, longer than common
  clients' own idle expiry (httpx and the MCP Python SDK 5 s, Node's fetch 4 s). uvicorn's 5 s
  tied httpx's: a client could send its next request on a connection it still held at 4.99 s
  idle while the server, whose clock started when it wrote the response, was closing it; the
  request then met a reset (a `ReadError` that no client retries, a POST not being idempotent).

Behind a TLS-terminating proxy these hold per proxy connection; the proxy should have its own.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from rlm_mcp.config import ServerSettings

__all__ = ["max_connections", "raise_fd_limit", "uvicorn_config"]

logger = logging.getLogger("rlm_mcp.server")

HEADROOM = 32  # connections beyond the sessions' own: viewer pages, a client reconnecting
FD_RESERVE = 256  # descriptors kept for SQLite, Docker, run logs, the LM client


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit; the resulting soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            logger.warning("could not raise the open-files limit from %d to %d", soft, hard)
    return soft


def max_connections(settings: ServerSettings, owners: int, fd_limit: int) -> int:
    """The bound on open HTTP connections: set, or derived from the session caps (each session may
    hold an SSE stream and a request), never more than the fds left after `FD_RESERVE`."""
    derived = 2 * settings.http_sessions_per_client * max(1, owners) + HEADROOM
    wanted = settings.http_max_connections or derived
    return max(1, min(wanted, fd_limit - FD_RESERVE)) if fd_limit > FD_RESERVE else max(1, wanted)


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection bound (set per server by
    `_protocol`)."""

    header_timeout_s: float = 10.0
    connection_bound: int = 1024
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.connection_bound:
            logger.warning("HTTP connection refused: %d open (the bound)", self.connection_bound)
            transport.abort()  # at once: the descriptor is freed, nothing is sent
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._waiting_for_headers():
            self._arm()
        super().data_received(data)
        if not self._waiting_for_headers():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.abort()


def _protocol(header_timeout_s: float, bound: int) -> type[H11Protocol]:
    return type("GuardedH11", (_GuardedH11,), {"header_timeout_s": header_timeout_s, "connection_bound": bound})


def uvicorn_config(settings: ServerSettings, app: Any, *, owners: int, **extra: Any) -> uvicorn.Config:
    """The uvicorn config of the HTTP server: the guarded protocol, the fd limit raised."""
    bound = max_connections(settings, owners, raise_fd_limit())
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=_protocol(settings.http_header_timeout_s, bound),
        timeout_keep_alive=settings.http_keep_alive_s,
        **extra,
    )
