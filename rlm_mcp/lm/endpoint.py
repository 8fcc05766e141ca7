"""One OpenAI-compatible endpoint: its settings and its keep-alive connection pool.

rlm-mcp talks to one or two endpoints: the root endpoint (`RLM_MCP_BASE_URL`), which serves
every root turn, and the sub-call endpoint (`RLM_MCP_SUB_BASE_URL` and its `RLM_MCP_SUB_*`
settings, each defaulting to the root's). When nothing of the sub-call endpoint differs from
the root's, the two are one `Endpoint` (one pool, one discovery cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from rlm_mcp.access import is_loopback_host
from rlm_mcp.config import LMSettings, server_of
from rlm_mcp.lm.http import HttpPool
from rlm_mcp.lm.length_field import CompletionLengthField, FieldSetting

EndpointName = Literal["root", "sub"]


@dataclass(frozen=True)
class EndpointConfig:
    """What differs between endpoints: address, key, window, completion-length field, extra body."""

    name: EndpointName  # "root", or "sub" when the sub-call endpoint is a separate one
    base_url: str  # …/v1, without a trailing slash
    api_key: str
    max_model_len: int | None
    completion_tokens_field: FieldSetting
    extra_body: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)

    @property
    def root_url(self) -> str:
        """Where endpoints beyond the OpenAI API live (/tokenize, /health, /props)."""
        return self.base_url.removesuffix("/v1")

    @property
    def setting(self) -> str:
        """The environment variable that sets this endpoint's address (named in fixes)."""
        return "RLM_MCP_BASE_URL" if self.name == "root" else "RLM_MCP_SUB_BASE_URL"

    @property
    def key_setting(self) -> str:
        return "RLM_MCP_API_KEY" if self.name == "root" else "RLM_MCP_SUB_API_KEY"

    @property
    def label(self) -> str:
        """How messages name it: "the LM endpoint" or "the sub-call endpoint"."""
        return "the LM endpoint" if self.name == "root" else "the sub-call endpoint"


# The placeholder key OpenAI clients send to servers that check none: no secret, so it carries over.
PLACEHOLDER_KEY = "EMPTY"


def root_key_withheld(settings: LMSettings) -> bool:
    """Whether the sub-call endpoint, another server with no key of its own, gets no key: the
    root's key is sent only to the root's server."""
    return settings.sub_api_key is None and settings.api_key != PLACEHOLDER_KEY and settings.separate_sub_server


def key_note(settings: LMSettings) -> str | None:
    """What the start log and `doctor` say when the root's key is withheld from sub-calls."""
    if not root_key_withheld(settings):
        return None
    scheme, host, port = server_of(settings.sub_base_url or "")
    return (
        f"sub-calls to {scheme}://{host}:{port} carry no API key: it is another server than the root's and "
        "RLM_MCP_SUB_API_KEY is unset (the root's key goes only to the root's server)"
    )


def endpoint_configs(settings: LMSettings) -> tuple[EndpointConfig, EndpointConfig | None]:
    """The root endpoint and, when anything of it differs, the sub-call endpoint (else None)."""
    root = EndpointConfig(
        name="root",
        base_url=settings.base_url.rstrip("/"),
        api_key=settings.api_key,
        max_model_len=settings.max_model_len,
        completion_tokens_field=settings.completion_tokens_field,
        extra_body=dict(settings.extra_body),
    )
    base_url = (settings.sub_base_url or settings.base_url).rstrip("/")
    same_server = base_url == root.base_url
    sub = EndpointConfig(
        name="sub",
        base_url=base_url,
        api_key=settings.sub_api_key
        if settings.sub_api_key is not None
        else ("" if root_key_withheld(settings) else settings.api_key),
        # The root's window override describes the root's server: it carries over only to it.
        max_model_len=settings.sub_max_model_len or (settings.max_model_len if same_server else None),
        completion_tokens_field=settings.sub_completion_tokens_field or settings.completion_tokens_field,
        extra_body=dict(settings.sub_extra_body if settings.sub_extra_body is not None else settings.extra_body),
    )
    if (sub.base_url, sub.api_key, sub.max_model_len, sub.completion_tokens_field, sub.extra_body) == (
        root.base_url,
        root.api_key,
        root.max_model_len,
        root.completion_tokens_field,
        root.extra_body,
    ):
        return root, None
    return root, sub


class Endpoint:
    """An endpoint's settings, its HTTP pool (made lazily, on the running loop) and its
    completion-length field memory."""

    def __init__(self, config: EndpointConfig, *, request_timeout_s: float) -> None:
        self.config = config
        self.base_url = config.base_url
        self.root_url = config.root_url
        self.request_timeout_s = request_timeout_s
        self.length_field = CompletionLengthField(config.completion_tokens_field, config.base_url)
        self._http: HttpPool | None = None

    def http(self) -> HttpPool:
        if self._http is None:
            from rlm_mcp.lm.plain_http import IDLE_REUSE_S  # with the pool: the LM layer's first call

            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            self._http = HttpPool(
                headers=headers,
                timeout_s=self.request_timeout_s,
                connect_s=min(10.0, self.request_timeout_s),
                # A proxy from the environment must not capture a local server.
                trust_env=not is_loopback_host(urlsplit(self.base_url).hostname or ""),
                # A plain-http server (vLLM on a GPU host) closes idle connections after 5 s; a
                # hosted https endpoint keeps them far longer, and a new one costs a TLS handshake.
                idle_reuse_s=IDLE_REUSE_S if urlsplit(self.base_url).scheme == "http" else None,
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
