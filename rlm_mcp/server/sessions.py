"""MCP sessions over HTTP, capped per owner.

The SDK caps sessions for the whole server only: 10,000 `initialize` requests filled it and
every client got 503 for the idle timeout's 30 minutes. Here each owner (see `guard`) holds at
most `per_owner` sessions; opening one more closes that owner's least recently used idle
session (through the SDK's own DELETE, so its memory is freed at once) rather than refusing,
so a flood only ever displaces the flooder's own sessions. A session is also bound to the
owner that opened it: another owner using its id gets 404, as for an unknown id.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlm_mcp.server.guard import scope_owner

logger = logging.getLogger("rlm_mcp.server")
SESSION_HEADER = "mcp-session-id"


@dataclass
class _Session:
    owner: str
    last_active: float
    in_flight: int = 0


class SessionLimiter:
    """ASGI middleware in front of the MCP endpoint (`path`)."""

    def __init__(self, app: ASGIApp, *, per_owner: int, idle_s: float, path: str = "/mcp") -> None:
        self._app = app
        self._per_owner = per_owner
        self._idle_s = idle_s
        self._path = path
        self._sessions: dict[str, _Session] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") != self._path:
            await self._app(scope, receive, send)
            return
        owner = scope_owner(scope)
        session_id = _header(scope, SESSION_HEADER)
        if session_id is None:
            await self._open(owner, scope, receive, send)
            return
        session = self._sessions.get(session_id)
        if session is None:  # unknown or expired: the SDK answers (404)
            await self._app(scope, receive, send)
            return
        if session.owner != owner:
            await _not_found(send)
            return
        session.in_flight += 1
        try:
            await self._app(scope, receive, send)
        finally:
            session.in_flight -= 1
            session.last_active = time.monotonic()
            if scope.get("method") == "DELETE":
                self._sessions.pop(session_id, None)

    async def _open(self, owner: str, scope: Scope, receive: Receive, send: Send) -> None:
        self._forget_idle()
        mine = sorted(
            ((sid, s) for sid, s in self._sessions.items() if s.owner == owner), key=lambda item: item[1].last_active
        )
        if len(mine) >= self._per_owner:
            idle = [sid for sid, s in mine if s.in_flight == 0]
            if not idle:
                await _too_many(send, self._per_owner)
                return
            await self._close(idle[0], scope)
        opened: list[str] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message.get("status", 500) < 400:
                for key, value in message.get("headers") or []:
                    if key.decode("latin-1").lower() == SESSION_HEADER:
                        opened.append(value.decode("latin-1"))
            await send(message)

        try:
            await self._app(scope, receive, watch)
        finally:
            for session_id in opened:
                self._sessions[session_id] = _Session(owner, time.monotonic())

    async def _close(self, session_id: str, scope: Scope) -> None:
        """End a session through the SDK's DELETE handling (it frees the session's task and streams)."""
        self._sessions.pop(session_id, None)
        logger.info("closing idle MCP session %s: its owner opened more than %d", session_id[:12], self._per_owner)
        headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() in (b"host", b"mcp-protocol-version")]
        delete_scope = {
            **scope,
            "method": "DELETE",
            "headers": [*headers, (SESSION_HEADER.encode(), session_id.encode())],
        }

        async def no_body() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(_message: Message) -> None:
            return None

        await self._app(delete_scope, no_body, discard)

    def _forget_idle(self) -> None:
        """Drop sessions the SDK has closed for idleness (same timeout, same rule: nothing in flight)."""
        now = time.monotonic()
        expired = [sid for sid, s in self._sessions.items() if s.in_flight == 0 and now - s.last_active > self._idle_s]
        for sid in expired:
            del self._sessions[sid]


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope.get("headers") or []:
        if key.lower() == wanted:
            return str(value.decode("latin-1"))
    return None


async def _respond(send: Send, status: int, message: str) -> None:
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    body = json.dumps(error).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _not_found(send: Send) -> None:
    await _respond(send, 404, "Session not found")


async def _too_many(send: Send, cap: int) -> None:
    await _respond(
        send, 429, f"This client already has {cap} sessions, all busy; raise RLM_MCP_HTTP_SESSIONS_PER_CLIENT"
    )
