"""Where a webhook may go: a callback URL a request names must be on its owner's allow-list
(the tokens file's `webhook_allow=` prefixes, or RLM_MCP_WEBHOOK_ALLOW for the owners no line covers), so a prompt-injected agent cannot send a run's
end anywhere else; at delivery the host is resolved once, every address it has must pass the URL
loader's address rules (public, or private/loopback only where RLM_MCP_ALLOW_PRIVATE_URLS /
RLM_MCP_ALLOWED_URL_ADDRESSES allow), and the connection goes to that pinned address (a DNS
answer that changes between the check and the connection cannot redirect it). Plain http only
to a loopback address; redirects are never followed."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio

from rlm_mcp.access import WebhookGrant
from rlm_mcp.errors import AccessDeniedError, BadArgumentError
from rlm_mcp.service.loaders.addresses import AddressPolicy

MAX_URL_CHARS = 2048


def on_allow_list(url: str, allow: tuple[str, ...]) -> bool:
    """`url` starts with a listed prefix at a boundary (`https://a.example` does not let
    `https://a.example.evil.net` through)."""
    for prefix in allow:
        if url == prefix:
            return True
        if url.startswith(prefix) and (prefix.endswith("/") or url[len(prefix)] in "/?#"):
            return True
    return False


def check_callback(url: str, grant: WebhookGrant | None) -> str:
    """The callback URL a request names, checked against its owner's grant; BadArgumentError otherwise."""
    parts = urlsplit(url)
    if len(url) > MAX_URL_CHARS or parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        raise BadArgumentError(
            "webhook_url must be an http(s) URL without credentials.", "Pass a URL your token's allow-list names."
        )
    if grant is None or not grant.secrets:
        raise AccessDeniedError(
            "This token has no webhook secret, so it cannot ask for webhooks.",
            "Ask the operator to add webhook_secret= and webhook_allow= to your token's line in the tokens file "
            "(stdio's local user and RLM_MCP_AUTH_TOKEN(S): RLM_MCP_WEBHOOK_SECRET and RLM_MCP_WEBHOOK_ALLOW).",
        )
    if not on_allow_list(url, grant.allow):
        raise AccessDeniedError(
            "This webhook_url is not on your token's allow-list.",
            "Use a URL under one of the prefixes the operator listed (webhook_allow= in the tokens file, or "
            "RLM_MCP_WEBHOOK_ALLOW).",
        )
    return url


@dataclass(frozen=True)
class Target:
    """A callback resolved once: connect to `address`, name `host` (Host header, TLS SNI)."""

    url: str  # the URL with the pinned address in place of the host
    host_header: str
    sni: str


async def pin(url: str, policy: AddressPolicy) -> Target:
    """Resolve the callback's host once and check every address; the URL to connect to.
    AccessDeniedError when an address is not allowed or plain http leaves loopback."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addrs = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addrs:
        raise AccessDeniedError(f"The webhook host '{host}' has no address.", "Fix the callback URL.")
    refused = [a for a in addrs if not policy.allows(a)]
    if refused:
        raise AccessDeniedError(
            f"The webhook host '{host}' resolves to a private or local address ({refused[0]}).",
            "Allow it with RLM_MCP_ALLOWED_URL_ADDRESSES (or RLM_MCP_ALLOW_PRIVATE_URLS), or use a public host.",
        )
    address = addrs[0]
    if parts.scheme == "http" and not address.is_loopback:
        raise AccessDeniedError("A webhook over plain http may only go to loopback.", "Use an https callback URL.")
    shown = f"[{address}]" if address.version == 6 else str(address)
    pinned = parts._replace(netloc=f"{shown}:{port}").geturl()
    return Target(url=pinned, host_header=parts.netloc.rsplit("@", 1)[-1], sni=host)
