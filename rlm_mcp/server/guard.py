"""Who may reach the HTTP server, and as whom (DESIGN §5, issue 14 items 7 and 11).

`RequestGuard` is an ASGI middleware in front of every route (the MCP endpoint and any other,
e.g. a viewer): it checks the Host and Origin headers against the actual bind (a browser page
on another site must never reach a loopback server: DNS rebinding), then the bearer token when
tokens are configured, and records the request's owner in `scope["state"]["rlm_owner"]`
(Starlette: `request.state.rlm_owner`). The owner is `LOCAL_OWNER` without tokens (one user),
else a stable id derived from the token (never the token itself).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from rlm_mcp.config import Settings
from rlm_mcp.owners import LOCAL_OWNER, Owner

__all__ = ["LOCAL_OWNER", "OWNER_KEY", "RequestGuard", "HostPolicy", "load_tokens", "owner_of_token", "scope_owner"]

OWNER_KEY = "rlm_owner"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def owner_of_token(token: str) -> Owner:
    return Owner("token-" + hashlib.sha256(token.encode()).hexdigest()[:16])


def scope_owner(scope: Scope) -> Owner:
    """The owner the guard recorded for this request (LOCAL_OWNER when there is no guard)."""
    state = scope.get("state") or {}
    owner = state.get(OWNER_KEY)
    return Owner(owner) if isinstance(owner, str) else LOCAL_OWNER


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _split_host(value: str) -> tuple[str, int | None] | None:
    """'host:port' / '[v6]:port' / 'host' -> (host lower-cased, port); None when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return None
        host, rest = value[1:end], value[end + 1 :]
    elif value.count(":") == 1:
        host, rest = value.split(":")
        rest = ":" + rest
    elif ":" in value:
        return None  # a bare IPv6 address must be bracketed in a Host header
    else:
        host, rest = value, ""
    if not host:
        return None
    if not rest:
        return host, None
    if not rest.startswith(":") or not rest[1:].isdigit():
        return None
    return host, int(rest[1:])


class HostPolicy:
    """The Host and Origin values a request may carry, derived from the bind."""

    def __init__(self, bind_host: str, port: int, extra_hosts: Iterable[str], extra_origins: Iterable[str]) -> None:
        self.port = port
        bind_ip = _ip(bind_host)
        self._wildcard = bind_ip is not None and bind_ip.is_unspecified
        self._ips: set[IPAddress] = set()
        self._names: set[str] = set()
        if bind_host.lower() == "localhost":
            self._ips |= {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
        if bind_ip is not None:
            self._ips.add(bind_ip)
        if bind_host.lower() == "localhost" or (bind_ip is not None and (bind_ip.is_loopback or self._wildcard)):
            self._names.add("localhost")
        if self._wildcard:  # reached by any of the machine's names (a token is required there)
            self._names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        elif bind_ip is None:
            self._names.add(bind_host.lower())
        self._extra_hosts = {h.strip().lower() for h in extra_hosts if h.strip()}
        self._extra_origins = {o.strip().lower().rstrip("/") for o in extra_origins if o.strip()}

    def host_ok(self, value: str) -> bool:
        if value.strip().lower() in self._extra_hosts:
            return True
        parsed = _split_host(value)
        if parsed is None:
            return False
        host, port = parsed
        if host in self._extra_hosts:
            return True
        if (port if port is not None else 80) != self.port:
            return False
        ip = _ip(host)
        if ip is not None:
            return self._wildcard or ip in self._ips
        return host in self._names

    def origin_ok(self, value: str | None) -> bool:
        """Absent: not a browser (fine). Present: the server's own origin or a configured one;
        another local origin (another port, another app) is refused unless configured."""
        if value is None:
            return True
        value = value.strip().lower().rstrip("/")
        if value in self._extra_origins:
            return True
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
            return False
        return self.host_ok(parts.netloc)


def load_tokens(settings: Settings) -> list[str]:
    """Every accepted token: RLM_MCP_AUTH_TOKEN, RLM_MCP_AUTH_TOKENS and the tokens file
    (one per line; blank lines and '#' comments ignored)."""
    tokens = [t for t in [settings.auth_token, *settings.auth_tokens] if t]
    if settings.auth_tokens_file is not None:
        text = settings.auth_tokens_file.expanduser().read_text()
        tokens += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return list(dict.fromkeys(tokens))


class RequestGuard:
    """ASGI middleware: 421 on a foreign Host, 403 on a foreign Origin, 401 without a valid
    token (when tokens are set); otherwise the owner is recorded and the request passes."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, tokens: Iterable[str]) -> None:
        self._app = app
        self._policy = policy
        self._tokens = [(f"Bearer {t}".encode(), owner_of_token(t)) for t in tokens]

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
        owner = LOCAL_OWNER
        if self._tokens:
            given = headers.get("authorization", "").encode("latin-1", "replace")
            # Compare with every token (constant time each), so timing does not tell which matched.
            matched = [o for expected, o in self._tokens if hmac.compare_digest(given, expected)]
            if not matched:
                await _refuse(
                    send,
                    401,
                    "unauthorized",
                    "Send Authorization: Bearer <token>.",
                    [(b"www-authenticate", b'Bearer realm="rlm-mcp"')],
                )
                return
            owner = matched[0]
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
