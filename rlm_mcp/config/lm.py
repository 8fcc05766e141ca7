"""The LM section: the root endpoint, the sub-call endpoint, their budgets and what models cost.
`LMClient` and the endpoint helpers (rlm_mcp/lm/) take this section."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_settings import NoDecode

from rlm_mcp.config.values import SECTION_CONFIG, CommaList, json_object, server_of
from rlm_mcp.config_check import check_endpoint_url

# Which field carries a request's completion budget (lm/length_field.py applies it).
CompletionTokensField = Literal["auto", "max_tokens", "max_completion_tokens"]


class ModelPrice(BaseModel):
    """What one model costs, in USD per million tokens. `cached_input`: prompt tokens the server
    answered from its prefix cache; default: the `input` price (no discount assumed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Finite: an infinite price (JSON's Infinity, or 1e999) made every cost infinite or NaN, which
    # the run records, the viewer's JSON and the cost counter cannot hold.
    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)
    cached_input: float | None = Field(None, ge=0, allow_inf_nan=False)


class LMSettings(BaseModel):
    """RLM_MCP_ settings of the LM endpoints (`settings.lm`)."""

    model_config = SECTION_CONFIG

    base_url: str = Field("http://localhost:8000/v1", description="OpenAI-compatible endpoint (…/v1).")
    model: str = Field("rlm-v0.1", description="Root model name (the LoRA adapter's name on vLLM).")
    sub_model: str | None = Field(None, description="Model for llm_query sub-calls; default: the root model.")
    api_key: str = Field("EMPTY", description="API key sent as a bearer token to the endpoint.")
    extra_body: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="Extra JSON fields merged into every chat request."
    )
    max_model_len: int | None = Field(
        None, description="Root model window in tokens; default: discovered from /v1/models, else 16384."
    )
    completion_tokens_field: CompletionTokensField = Field(
        "auto", description="Field of the completion budget; auto: max_tokens, max_completion_tokens where refused."
    )
    root_max_tokens: int = Field(4096, description="Completion budget of each root turn.")
    sub_max_tokens: int = Field(4096, description="Completion budget of each sub-call.")
    min_completion_tokens: int = Field(1024, description="Floor below which the root budget never shrinks.")
    request_timeout_s: float = Field(600.0, description="Read timeout of one LM request.")
    lm_retries: int = Field(3, description="Retries of one LM request on 429/5xx/connection errors.")
    max_concurrent_lm_calls: int = Field(
        16,
        description=(
            "Concurrent LM requests across all runs and depths, at most: each endpoint and model's limit "
            "adapts below it to 429/503 answers."
        ),
    )
    lm_queueing_cut: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Latency as a load signal: cut an endpoint's limit when its calls take this many times "
            "the latency of its fastest recent calls of their size (e.g. 2); 0: off (429/503 only)."
        ),
    )
    max_sub_calls_per_run: int = Field(2000, description="Sub-LM calls one run tree may make.")
    allowed_sub_models: CommaList = Field(
        default_factory=list,
        description="Comma-separated extra models code may name in llm_query(model=...); others fall back to the "
        "sub model. The sub model may always be named, the root model too unless RLM_MCP_SUB_BASE_URL is another "
        "server (then only when listed here).",
    )
    # Sub-call endpoint (llm_query*, rlm_query at the depth limit); each unset value is the root's.
    sub_base_url: str | None = Field(None, description="Endpoint of sub-calls (…/v1); default: base_url.")
    sub_api_key: str | None = Field(
        None,
        description="API key of the sub-call endpoint; default: api_key on the root's server, none on another "
        "(another scheme, host or port: never the root's key; the start log and doctor say so).",
    )
    sub_max_model_len: int | None = Field(
        None,
        description="Sub-call window in tokens; default: max_model_len when the endpoint is the root's, else discovered.",
    )
    sub_completion_tokens_field: CompletionTokensField | None = Field(
        None, description="completion_tokens_field of the sub-call endpoint; default: the root's."
    )
    sub_extra_body: Annotated[dict[str, Any] | None, NoDecode] = Field(
        None, description="extra_body of the sub-call endpoint (JSON); default: the root's."
    )
    # Routing keys for replica routers (vllm-router consistent_hash, production-stack session).
    session_affinity: bool = Field(True, description="Root calls carry the run id in session_header.")
    session_header: str = Field(
        "X-Session-ID",
        pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$",
        description="Header carrying the run id on root calls.",
    )
    model_prices: Annotated[dict[str, ModelPrice], NoDecode] = Field(
        default_factory=dict,
        description='Prices per model, USD per million tokens: {"model": {"input": 3, "cached_input": 0.3, "output": 15}}.',
    )

    @field_validator("model_prices", mode="before")
    @classmethod
    def _parse_prices(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return {}
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    'RLM_MCP_MODEL_PRICES must be a JSON object such as {"my-model": {"input": 3, "output": 15}}: '
                    f"{exc}"
                ) from exc
        return value

    @field_validator("extra_body", "sub_extra_body", mode="before")
    @classmethod
    def _parse_extra_body(cls, value: Any, info: ValidationInfo) -> Any:
        name = f"RLM_MCP_{(info.field_name or '').upper()}"
        return json_object(value, name, empty={} if info.field_name == "extra_body" else None)

    @field_validator("lm_queueing_cut", mode="after")
    @classmethod
    def _check_queueing_cut(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError(
                "RLM_MCP_LM_QUEUEING_CUT is a ratio of latencies above 1 (e.g. 2: cut when calls take twice "
                "as long as the fastest recent ones of their size), or 0 for off"
            )
        return value

    @field_validator("base_url", mode="after")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        return check_endpoint_url(value)

    @property
    def effective_sub_model(self) -> str:
        return self.sub_model or self.model

    @property
    def separate_sub_server(self) -> bool:
        """Whether sub-calls go to another server than the root's (another scheme, host or port)."""
        return self.sub_base_url is not None and server_of(self.sub_base_url) != server_of(self.base_url)

    @property
    def sandbox_models(self) -> set[str]:
        """The models sandbox code may name in a sub-call. With sub-calls on another server, the
        root model (the root's server, its key) is one only when RLM_MCP_ALLOWED_SUB_MODELS lists it."""
        root_model = set() if self.separate_sub_server else {self.model}
        return {*root_model, self.effective_sub_model, *self.allowed_sub_models}
