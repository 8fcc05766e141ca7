"""Who may reach an HTTP surface of rlm-mcp: one rule, one place.

Neutral: `server/` (the MCP endpoint's `RequestGuard`), `viewer/` (the `/runs/` pages and
`rlm-mcp runs view`) and `lm/` (is the endpoint on this machine?) import it; it imports only
`config` and `owners`, so no layer has to import another's internals for these rules.

- `is_loopback_host`: the one loopback test (`localhost`, 127.0.0.0/8, ::1, bracketed or not);
- `HostPolicy`: the Host and Origin values a request may carry, derived from the bind (a page on
  another site must never reach a loopback server: DNS rebinding); `host_policy` builds the HTTP
  server's from its settings (the bind, the allowed hosts and origins, the public URL);
- `BearerTokens`: which owner an `Authorization: Bearer` header proves, compared in constant time
  with every accepted token; `owner_of_token` names that owner (never the token itself);
- `load_tokens`: every accepted token from the settings; `webhook_grants`: what the tokens
  file grants each token's owner for webhooks (its signing secrets and its callback allow-list).

The tokens file holds one token per line, as it always has; a line may go on with options
after the token, separated by spaces: `webhook_secret=whsec_<base64>` (one or more: every
secret signs, so a receiver that knows either verifies during a rotation) and
`webhook_allow=<URL prefix>` (one or more: the callback URLs a request may name). A line whose
later words are not all such options is one token, as before (a token with a space in it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from rlm_mcp.config import ServerSettings
from rlm_mcp.owners import LOCAL_OWNER

__all__ = [
    "BearerTokens",
    "HostPolicy",
    "WebhookGrant",
    "host_policy",
    "is_loopback_host",
    "load_tokens",
    "owner_of_token",
    "webhook_grants",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback address (`127.0.0.1`, `::1`, `[::1]`); names other than
    `localhost` are not resolved (a name could point anywhere)."""
    if host.strip().lower() == "localhost":
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def owner_of_token(token: str) -> str:
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:16]


class BearerTokens:
    """The accepted bearer tokens, and the owner a presented `Authorization` header proves."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._expected = [(f"Bearer {t}".encode(), owner_of_token(t)) for t in tokens]

    def __bool__(self) -> bool:
        return bool(self._expected)

    def owner(self, authorization: str | None) -> str | None:
        """The owner the header proves (LOCAL_OWNER when no token is set), else None."""
        if not self._expected:
            return LOCAL_OWNER
        given = (authorization or "").encode("latin-1", "replace")
        # Compare with every token (constant time each), so timing does not tell which matched.
        matched = [owner for expected, owner in self._expected if hmac.compare_digest(given, expected)]
        return matched[0] if matched else None


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]"))
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

    def __init__(
        self,
        bind_host: str,
        port: int,
        extra_hosts: Iterable[str],
        extra_origins: Iterable[str],
        *,
        host_only: Iterable[str] = (),
    ) -> None:
        """`host_only`: names accepted in `Host` (any port) but never as an Origin's host; the
        public URL's name, whose one origin is in `extra_origins`."""
        self.port = port
        bind_ip = _ip(bind_host)
        self._wildcard = bind_ip is not None and bind_ip.is_unspecified
        self._ips: set[IPAddress] = set()
        self._names: set[str] = set()
        if bind_host.lower() == "localhost":
            self._ips |= {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
        if bind_ip is not None:
            self._ips.add(bind_ip)
        if is_loopback_host(bind_host) or self._wildcard:
            self._names.add("localhost")
        if self._wildcard:  # reached by any of the machine's names (a token is required there)
            self._names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        elif bind_ip is None:
            self._names.add(bind_host.lower())
        self._extra_hosts = {h.strip().lower() for h in extra_hosts if h.strip()}
        self._host_only = {h.strip().lower() for h in host_only if h.strip()}
        self._extra_origins = {key for o in extra_origins if (key := _origin_key(o)) is not None}

    def host_ok(self, value: str) -> bool:
        return self._host_ok(value, self._extra_hosts | self._host_only)

    def _host_ok(self, value: str, extra: set[str]) -> bool:
        if value.strip().lower() in extra:
            return True
        parsed = _split_host(value)
        if parsed is None:
            return False
        host, port = parsed
        if host in extra:
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
        key = _origin_key(value)
        if key is None:
            return False
        if key in self._extra_origins:
            return True
        # The public URL's name matches only its exact origin (above): another scheme or port
        # of the same host is another site (a plain-http page, another service on that host).
        return self._host_ok(urlsplit(value.strip().lower()).netloc, self._extra_hosts)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_key(value: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, the scheme's default port filled in; None if malformed."""
    value = value.strip().lower().rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc or parts.path or parts.query or parts.fragment:
        return None
    split = _split_host(parts.netloc)
    if split is None or "@" in parts.netloc:
        return None
    host, port = split
    return parts.scheme, host, port if port is not None else _DEFAULT_PORTS[parts.scheme]


def host_policy(settings: ServerSettings) -> HostPolicy:
    """The HTTP server's policy: its bind, `RLM_MCP_ALLOWED_HOSTS` / `_ORIGINS`, and the host and
    origin of `RLM_MCP_PUBLIC_URL` (the name a proxy serves it by: no need to list it twice)."""
    origins = list(settings.allowed_origins)
    public_hosts: list[str] = []
    if settings.public_url:
        public_hosts.append(urlsplit(settings.public_url).netloc)
        origins.append(settings.public_url)
    return HostPolicy(settings.host, settings.port, settings.allowed_hosts, origins, host_only=public_hosts)


def load_tokens(settings: ServerSettings) -> list[str]:
    """Every accepted token: RLM_MCP_AUTH_TOKEN, RLM_MCP_AUTH_TOKENS and the tokens file
    (one per line, options after it; blank lines and '#' comments ignored)."""
    tokens = [t for t in [settings.auth_token, *settings.auth_tokens] if t]
    if settings.auth_tokens_file is not None:
        tokens += [token for token, _ in _file_lines(settings.auth_tokens_file.expanduser().read_text())]
    return list(dict.fromkeys(tokens))


_OPTIONS = ("webhook_secret=", "webhook_allow=")
SECRET_PREFIX = "whsec_"


@dataclass(frozen=True)
class WebhookGrant:
    """What one owner may do with webhooks: sign with `secrets` (raw key bytes, each from a
    `whsec_<base64>` secret), call back only URLs starting with one of `allow`."""

    secrets: tuple[bytes, ...] = ()
    allow: tuple[str, ...] = ()

    def __repr__(self) -> str:  # never the secrets, in a log or a traceback
        return f"WebhookGrant(secrets=<{len(self.secrets)}>, allow={self.allow!r})"


def _file_lines(text: str) -> list[tuple[str, list[str]]]:
    """(token, its option words) for each line of a tokens file."""
    found = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = line.split()
        if len(words) > 1 and all(w.startswith(_OPTIONS) for w in words[1:]):
            found.append((words[0], words[1:]))
        else:
            found.append((line.strip(), []))
    return found


def _secret_bytes(value: str, where: str) -> bytes:
    """The key of a `whsec_<base64>` secret; ValueError naming the line (never the secret)."""
    if not value.startswith(SECRET_PREFIX):
        raise ValueError(f"{where}: a webhook_secret must start with {SECRET_PREFIX} (Standard Webhooks' form)")
    try:
        key = base64.b64decode(value[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: the webhook_secret after {SECRET_PREFIX} is not base64") from None
    if len(key) < 24:
        raise ValueError(f"{where}: a webhook_secret needs at least 24 random bytes (32 recommended)")
    return key


def webhook_grants(settings: ServerSettings) -> dict[str, WebhookGrant]:
    """Each owner's webhook grant: from its tokens-file line, or, for the owners no line covers
    (the local user of stdio and the CLI, the tokens of RLM_MCP_AUTH_TOKEN(S)), from
    RLM_MCP_WEBHOOK_SECRET / RLM_MCP_WEBHOOK_ALLOW. Owners with neither have none. ValueError
    naming the line or the setting when an option is malformed."""
    grants = _file_grants(settings)
    shared = _settings_grant(settings)
    if shared is not None:
        env_tokens = [t for t in (settings.auth_token, *settings.auth_tokens) if t and t.strip()]
        for owner in (LOCAL_OWNER, *(owner_of_token(t.strip()) for t in env_tokens)):
            grants.setdefault(owner, shared)  # a token's own line wins
    return grants


def _settings_grant(settings: ServerSettings) -> WebhookGrant | None:
    secret = settings.webhook_secret.get_secret_value().strip() if settings.webhook_secret is not None else ""
    allow = tuple(p.strip() for p in settings.webhook_allow if p.strip())
    if not secret and not allow:
        return None
    if not secret:
        raise ValueError("RLM_MCP_WEBHOOK_ALLOW is set without RLM_MCP_WEBHOOK_SECRET (nothing could sign)")
    if not allow:
        raise ValueError("RLM_MCP_WEBHOOK_SECRET is set without RLM_MCP_WEBHOOK_ALLOW (no callback URL is allowed)")
    secrets = tuple(_secret_bytes(v.strip(), "RLM_MCP_WEBHOOK_SECRET") for v in secret.split(",") if v.strip())
    _check_prefixes(allow, "RLM_MCP_WEBHOOK_ALLOW")
    return WebhookGrant(secrets=secrets, allow=allow)


def _check_prefixes(allow: Iterable[str], where: str) -> None:
    for prefix in allow:
        parts = urlsplit(prefix)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{where}: webhook_allow={prefix!r} is not an http(s) URL prefix")


def _file_grants(settings: ServerSettings) -> dict[str, WebhookGrant]:
    if settings.auth_tokens_file is None:
        return {}
    path = settings.auth_tokens_file.expanduser()
    grants: dict[str, WebhookGrant] = {}
    for n, (token, options) in enumerate(_file_lines(path.read_text()), start=1):
        where = f"{path}, token {n}"
        secrets = tuple(_secret_bytes(o.split("=", 1)[1], where) for o in options if o.startswith(_OPTIONS[0]))
        allow = tuple(o.split("=", 1)[1] for o in options if o.startswith(_OPTIONS[1]))
        _check_prefixes(allow, where)
        if secrets or allow:
            grants[owner_of_token(token)] = WebhookGrant(secrets=secrets, allow=allow)
    return grants
