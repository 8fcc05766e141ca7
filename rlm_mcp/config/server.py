"""The server section: how MCP clients reach this server (stdio or HTTP), who may, and what it
logs and exposes to an operator."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator

from rlm_mcp.config.values import SECTION_CONFIG, CommaList

# How MCP clients reach the server.
Transport = Literal["stdio", "http"]


class ServerSettings(BaseModel):
    """RLM_MCP_ settings of the MCP server, its HTTP transport and access (`settings.server`)."""

    model_config = SECTION_CONFIG

    transport: Transport = Field("stdio", description="How MCP clients reach the server: stdio or http.")
    host: str = Field("127.0.0.1", description="HTTP bind address.")
    port: int = Field(8765, description="HTTP port.")
    auth_token: str | None = Field(None, description="Bearer token required by the HTTP transport.")
    auth_tokens: CommaList = Field(
        default_factory=list, description="More accepted tokens, comma-separated; each one owns its contexts and runs."
    )
    auth_tokens_file: Path | None = Field(None, description="File of accepted tokens, one per line ('#' comments).")
    webhook_secret: SecretStr | None = Field(
        None,
        description="Webhooks for the owners no tokens-file line covers (stdio's local user, RLM_MCP_AUTH_TOKEN(S)): "
        "the whsec_<base64> signing secret (comma-separated: several sign side by side during a rotation). "
        "Needs RLM_MCP_WEBHOOK_ALLOW.",
    )
    webhook_allow: CommaList = Field(
        default_factory=list,
        description="The callback URL prefixes those owners' webhook_url may start with (comma-separated).",
    )
    allowed_hosts: CommaList = Field(
        default_factory=list, description="Extra Host header values accepted over HTTP (e.g. a proxy's name)."
    )
    allowed_origins: CommaList = Field(
        default_factory=list, description="Extra browser origins allowed over HTTP (e.g. http://localhost:3000)."
    )
    public_url: str | None = Field(
        None,
        description="The URL clients and browsers reach this server by through a proxy (https://rlm.example.com).",
    )
    http_sessions_per_client: int = Field(
        16, ge=1, description="MCP sessions one client (token) keeps open; more close its least recently used."
    )
    http_session_idle_s: float = Field(600.0, gt=0, description="An HTTP MCP session idle this long is closed.")
    http_header_timeout_s: float = Field(
        10.0, gt=0, description="Seconds a request's headers may take to arrive; slower connections are closed."
    )
    http_keep_alive_s: int = Field(
        20,
        ge=1,
        description=(
            "Seconds an idle keep-alive connection stays open; keep it above clients' own idle expiry "
            "(httpx 5 s, Node 4 s) so a client never reuses a connection the server is closing."
        ),
    )
    http_max_connections: int | None = Field(
        None, ge=1, description="Open HTTP connections; default 2 x sessions per client x tokens + 32."
    )
    log_level: str = Field(
        "INFO", description="Log level; logs go to stderr (a server over HTTP: one access line per request at INFO)."
    )
    metrics_public: bool = Field(
        False, description="GET /metrics answers without the bearer token (a scraper on a private network)."
    )

    @field_validator("public_url", mode="after")
    @classmethod
    def _check_public_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL naming a host, such as https://rlm.example.com")
        if parts.username or parts.password or parts.query or parts.fragment or parts.path not in ("", "/"):
            raise ValueError(
                "must be the scheme, host and port only (https://rlm.example.com): serve rlm-mcp at the root of "
                "its host name (a path prefix is not supported)"
            )
        return f"{parts.scheme}://{parts.netloc.lower()}"
