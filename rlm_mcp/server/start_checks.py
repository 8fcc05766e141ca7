"""What the HTTP server checks before it listens.

- A listener off loopback without a token is refused, whatever it serves: MCP runs code, and a
  worker's `/metrics` tells anyone who reaches it about every owner's runs (a worker without
  tokens binds loopback by default; one told RLM_MCP_HOST=0.0.0.0, often by an environment file
  meant for the fronts, stops with the fix rather than quietly binding another address, which a
  remote probe would then fail to reach with no word why).
- A token source that is configured but yields no token (a tokens file holding only blank or
  comment lines: a rotation in progress, a truncated write; a blank RLM_MCP_AUTH_TOKEN; an
  RLM_MCP_AUTH_TOKENS of only commas and blanks) stops the start with one line naming the setting:
  it would otherwise serve with no authentication.
- With several tokens (several owners), path and glob loads read files under roots that every
  token shares. The default root (the server user's home) was never chosen for that, so with
  several tokens no root is open unless RLM_MCP_ALLOWED_ROOTS is set on purpose.
- With several tokens, each owner has a share of the context store (`owner_caps.derived_share`:
  the cap divided by the tokens unless RLM_MCP_STORE_MAX_BYTES_PER_OWNER is set), said in the
  start log: one owner's loads never push out another owner's contexts.
"""

from __future__ import annotations

import logging

from rlm_mcp.access import is_loopback_host, load_tokens
from rlm_mcp.config import Settings
from rlm_mcp.errors import AccessDeniedError
from rlm_mcp.store.owner_caps import derived_share

__all__ = ["checked_tokens", "refuse_open_bind", "roots_for_owners", "shares_for_owners"]

log = logging.getLogger("rlm_mcp.server")


def checked_tokens(settings: Settings) -> list[str]:
    """Every accepted token; an unreadable or empty configured source raises, naming it."""
    if settings.server.auth_token is not None and not settings.server.auth_token.strip():
        raise AccessDeniedError(
            "RLM_MCP_AUTH_TOKEN is set but blank, so it names no token.",
            "Set it to a token, or unset it.",
        )
    if "auth_tokens" in settings.model_fields_set and not any(t.strip() for t in settings.server.auth_tokens):
        raise AccessDeniedError(
            "RLM_MCP_AUTH_TOKENS is set but names no token (only commas or blanks).",
            "Set it to comma-separated tokens, or unset it.",
        )
    try:
        tokens = load_tokens(settings.server)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise AccessDeniedError(
            f"The tokens file {settings.server.auth_tokens_file} cannot be read ({reason}).",
            "Fix RLM_MCP_AUTH_TOKENS_FILE, or unset it.",
        ) from None
    if settings.server.auth_tokens_file is not None and not (set(tokens) - _other_tokens(settings)):
        raise AccessDeniedError(
            f"The tokens file {settings.server.auth_tokens_file} holds no token (only blank or '#' lines).",
            "Put one token per line in it (RLM_MCP_AUTH_TOKENS_FILE), or unset RLM_MCP_AUTH_TOKENS_FILE.",
        )
    return tokens


def refuse_open_bind(settings: Settings, tokens: list[str], *, serves_mcp: bool) -> None:
    """Raise, with the fix, when this listener would serve off loopback with no token to check."""
    if tokens or is_loopback_host(settings.server.host):
        return
    if serves_mcp:
        raise AccessDeniedError(
            f"Refusing to serve HTTP on {settings.server.host} without a token: anyone who can reach it could run code.",
            "Set RLM_MCP_AUTH_TOKEN (clients then send Authorization: Bearer <token>), or bind 127.0.0.1.",
        )
    raise AccessDeniedError(
        f"Refusing to serve the worker's /metrics on {settings.server.host} without a token: anyone who can reach it "
        "would read every owner's run counts, tokens and cost.",
        "Set RLM_MCP_AUTH_TOKENS to the fronts' tokens (scrapers then send Authorization: Bearer <token>), or "
        "bind loopback with --host 127.0.0.1 (as deploy/systemd/rlm-mcp-worker.service does).",
    )


def _other_tokens(settings: Settings) -> set[str]:
    return {t for t in [settings.server.auth_token, *settings.server.auth_tokens] if t}


def roots_for_owners(settings: Settings, tokens: list[str]) -> Settings:
    """The settings the server runs with: with several tokens and roots not set on purpose, no
    root is open to path/glob loads (the refusal names RLM_MCP_ALLOWED_ROOTS)."""
    if len(tokens) > 1 and "allowed_roots" not in settings.model_fields_set:
        return settings.model_copy(update={"allowed_roots": []})
    return settings


def shares_for_owners(settings: Settings, tokens: list[str]) -> Settings:
    """The settings the server runs with: each owner's share of the store set (derived from the
    cap and the number of tokens when several tokens share the server and none is set)."""
    share, why = derived_share(settings.store, len(tokens))
    log.info("context store share: %s", why)
    if share == settings.store.store_max_bytes_per_owner:
        return settings
    return settings.model_copy(update={"store_max_bytes_per_owner": share})
