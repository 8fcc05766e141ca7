"""One settings model for the whole server.

Values come from, highest first: explicit keyword arguments (the CLI passes its flags this
way), environment variables `RLM_MCP_*`, an optional TOML file (`RLM_MCP_CONFIG`), defaults.
Layers never read the environment themselves: they are handed a `Settings`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from rlm_mcp.config_check import (
    CONFIG_VAR,
    SettingsError,
    check_config_file,
    check_endpoint_url,
    describe_validation_error,
)
from rlm_mcp.config_forms import FormFieldsFilled
from rlm_mcp.database_url import check_database_url
from rlm_mcp.prompt_file import MAX_PROMPT_BYTES, PromptFileError, prompt_file_path, read_prompt_file

DEFAULT_IMAGE = "rlm-mcp-sandbox:0.2"  # the version moves with what the image holds (0.2: python3-dill)
# Which field carries a request's completion budget (lm/length_field.py applies it).
CompletionTokensField = Literal["auto", "max_tokens", "max_completion_tokens"]
# How MCP clients reach the server.
Transport = Literal["stdio", "http"]


# What fits in one sandbox (sandbox/manager.py checks each run's contexts against it): 85% of its
# memory limit, less what the kernel itself takes; a text context needs about twice its size there
# while it loads (its chunks, then the joined string).
SANDBOX_USABLE_SHARE = 0.85
SANDBOX_KERNEL_BYTES = 48 << 20
TEXT_MEMORY_FACTOR = 2


def sandbox_usable_bytes(memory: str) -> int:
    """Bytes of contexts a sandbox with this memory limit (`1g`) can hold."""
    return int(parse_size(memory) * SANDBOX_USABLE_SHARE) - SANDBOX_KERNEL_BYTES


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("rlm-mcp", appauthor=False))


def _default_roots() -> list[Path]:
    return [Path.home()]


_DEFAULT_PORTS = {"http": 80, "https": 443}


def server_of(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an endpoint URL, the port defaulted by scheme: what makes two
    endpoints one server."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port if port is not None else _DEFAULT_PORTS.get(scheme)


class ModelPrice(BaseModel):
    """What one model costs, in USD per million tokens. `cached_input`: prompt tokens the server
    answered from its prefix cache; default: the `input` price (no discount assumed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)


class Settings(BaseSettings):
    """Every knob of rlm-mcp. The docs' configuration table is generated from this class (tools/docs_pages.py)."""

    model_config = SettingsConfigDict(env_prefix="RLM_MCP_", extra="ignore", validate_default=True)

    # --- LM endpoint -------------------------------------------------------------------------
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
    max_concurrent_lm_calls: int = Field(16, description="Concurrent LM requests across all runs and depths.")
    max_sub_calls_per_run: int = Field(2000, description="Sub-LM calls one run tree may make.")
    max_prompts_per_batch: int = Field(512, description="Prompts one llm_query_batched call may carry.")
    allowed_sub_models: Annotated[list[str], NoDecode] = Field(
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

    # --- RLM loop ----------------------------------------------------------------------------
    prompt_profile: str = Field(
        "auto", description="auto (canonical for the adapter, else rlm-mcp) | canonical | rlm-mcp | file:PATH"
    )
    reference_fetch: bool = Field(
        True, description="auto/canonical: fetch the pinned reference wheel (rlms 0.1.3) once when it is missing."
    )
    max_iterations: int = Field(20, ge=1, le=200, description="Root turns per run.")
    max_depth: int = Field(1, ge=1, le=5, description="Recursion depth; 1 means rlm_query is llm_query.")
    max_concurrent_children: int = Field(4, ge=1, description="Child RLMs one run tree runs at once, per depth.")
    timeout_s: float = Field(900.0, gt=0, description="Wall-clock limit of one run.")
    token_budget: int | None = Field(None, description="Tokens (prompt+completion) one run tree may spend.")
    max_errors: int = Field(5, ge=1, description="Consecutive cells that raised before the run ends.")
    submit_on_max_iterations: bool = Field(True, description="One extra 'submit now' turn at max_iterations.")
    output_chars: int = Field(20_000, description="Characters of each block's output shown to the model.")
    answer_max_chars: int = Field(20_000, description="Answer characters in a tool result (full: resource).")

    # --- Sandbox -----------------------------------------------------------------------------
    sandbox_backend: Literal["docker"] = Field(
        "docker", description="What makes the sandboxes (docs/architecture.md, Backends); Docker only so far."
    )
    sandbox_image: str = Field(DEFAULT_IMAGE, description="Docker image the sandboxes run.")
    sandbox_runtime: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="OCI runtime of the sandboxes, e.g. runsc (gVisor); default: the engine's default (runc).",
    )
    sandbox_memory: str = Field("1g", description="Memory limit (= memory+swap) of one sandbox.")
    sandbox_cpus: float = Field(1.0, gt=0, description="CPU quota of one sandbox.")
    sandbox_total_cpus: float | None = Field(
        None,
        gt=0,
        description="CPUs all sandboxes in use share (each gets min(sandbox_cpus, total / N)); default: the Docker host's.",
    )
    sandbox_pids: int = Field(128, ge=16, description="Process/thread limit of one sandbox.")
    sandbox_tmpfs: str = Field("256m", description="Size of the writable /tmp in a sandbox.")
    sandbox_shm: str = Field("64m", description="Size of /dev/shm in a sandbox.")
    sandbox_user: str = Field("1000:1000", description="uid:gid the sandbox code runs as.")
    cell_timeout_s: float = Field(60.0, gt=0, description="Running time of one cell (LM waits excluded).")
    cell_wall_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Wall-clock ceiling of one cell, LM waits included (the running-time limit's backstop).",
    )
    cell_output_bytes: int = Field(1 << 20, description="Captured output kept per cell (head and tail).")
    pool_size: int = Field(2, ge=0, le=32, description="Warm, kernel-ready sandboxes kept started.")
    max_sandboxes: int = Field(8, ge=1, description="Sandboxes this server runs at once.")
    instance_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Owner label of this server's sandboxes; default: random per start. Never share one.",
    )

    # --- Runs --------------------------------------------------------------------------------
    max_runs: int = Field(4, ge=1, description="Runs executing at once; more wait (with progress).")
    max_runs_per_owner: int | None = Field(
        None,
        ge=1,
        description="Runs one owner (token) may have executing at once; more wait in the queue without taking a "
        "slot, so one token cannot hold every slot. Default: all of RLM_MCP_MAX_RUNS with one token (or stdio), "
        "half of them (rounded up) when several tokens are configured. Team mode applies the same share to "
        "the run slots of all live workers.",
    )
    run_queue_timeout_s: float = Field(60.0, description="How long a run waits for a free slot.")
    run_max_queued: int = Field(64, ge=0, description="Runs waiting for a slot, all owners; more are refused.")
    run_max_queued_per_owner: int = Field(
        16, ge=0, description="Runs one owner (token) may have waiting for a slot; more are refused."
    )
    session_idle_s: float = Field(
        900.0, gt=0, description="A kept session whose REPL sat idle this long is closed (its sandbox released)."
    )
    session_max_age_s: float = Field(86400.0, gt=0, description="A kept session ends this long after it started.")
    session_snapshot_max_bytes: int = Field(
        256 << 20,
        ge=0,
        description="Largest snapshot of a kept session's namespace; a bigger one is not kept (the session then "
        "ends when its sandbox is released). 0: no snapshots.",
    )
    session_snapshot_bytes_per_owner: int = Field(
        1 << 30,
        ge=0,
        description="Snapshot bytes one owner's kept sessions may hold together; a snapshot past it is not kept.",
    )
    session_prefer_worker_s: float = Field(
        2.0,
        ge=0,
        description="Team mode: how long a kept session's follow-up waits for the worker that holds its live "
        "sandbox before any worker may take it (restoring the session from its snapshot).",
    )
    session_snapshot_wait_s: float = Field(
        30.0,
        ge=0,
        description="Team mode: how long a follow-up waits for the snapshot taken after the session's previous "
        "run (in the background, once its result was out) before it goes on without it.",
    )
    max_sessions_per_owner: int = Field(4, ge=0, description="Kept sessions one owner (token) may hold open at once.")
    run_max_records: int = Field(1000, ge=1, description="Finished run records kept on disk (newest first).")
    run_max_age_days: float = Field(30.0, description="Run records untouched this long are removed (0: never).")
    log_sub_call_chars: int = Field(
        2000, ge=0, description="Characters of each sub-call prompt and answer kept in the run log (head + tail)."
    )

    # --- Contexts and storage ----------------------------------------------------------------
    data_dir: Path = Field(default_factory=_default_data_dir, description="Contexts, runs, index.")
    allowed_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=_default_roots,
        description="Folders (os.pathsep-separated) MCP clients may load paths from; local commands read the paths typed to them.",
    )
    max_context_bytes: int = Field(
        0,
        ge=0,
        description="Largest single context in bytes; 0 (the default): the largest text context one sandbox of "
        "RLM_MCP_SANDBOX_MEMORY holds (about 410 MiB at 1g), so the two limits agree; raise the memory to raise both.",
    )
    store_max_bytes: int = Field(20 << 30, description="Context store size before LRU eviction.")
    store_max_bytes_per_owner: int | None = Field(
        None,
        ge=1,
        description="Each owner's (token's) share of the store: its contexts' bytes, and apart from them its "
        "unfinished uploads' bytes; default: with several tokens RLM_MCP_STORE_MAX_BYTES / tokens (so the shares fit "
        "the store's cap and one owner's loads never evict another's contexts), else none. The start log and doctor "
        "say the share in force.",
    )
    store_max_age_days: float = Field(30.0, description="Contexts unused this long are evicted.")
    context_grace_s: float = Field(
        900.0, ge=0, description="A context stored or used this recently is never evicted (covers load -> complete)."
    )
    max_files: int = Field(20_000, description="Files one folder/glob load may take.")

    # --- Team mode (docs/team.md) ----------------------------------------------------------------
    database_url: SecretStr | None = Field(
        None,
        description="postgresql://user:password@host:port/db: shared state on PostgreSQL (needs the team extra: `uv run --extra team` from a checkout).",
    )
    role: Literal["both", "front", "worker"] = Field(
        "both",
        description="Team mode: front (MCP, enqueues runs), worker (runs queued runs, no MCP) or both.",
    )
    worker_lease_s: float = Field(
        30.0, gt=0, description="Team mode: a worker silent this long is lost; its runs end with a status."
    )
    queue_poll_s: float = Field(
        1.0, gt=0, description="Team mode: how often fronts and workers poll the queue (NOTIFY wakes them sooner)."
    )
    url_timeout_s: float = Field(30.0, description="Timeout of a URL fetch.")
    url_max_redirects: int = Field(5, description="Redirects a URL fetch may follow.")
    allow_private_urls: bool = Field(
        False, description="Over HTTP, allow URLs on private networks (never loopback or link-local unless listed)."
    )
    allowed_url_addresses: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated addresses or networks URL loads may always reach."
    )

    # --- Server ------------------------------------------------------------------------------
    transport: Transport = Field("stdio", description="How MCP clients reach the server: stdio or http.")
    host: str = Field("127.0.0.1", description="HTTP bind address.")
    port: int = Field(8765, description="HTTP port.")
    auth_token: str | None = Field(None, description="Bearer token required by the HTTP transport.")
    auth_tokens: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="More accepted tokens, comma-separated; each one owns its contexts and runs."
    )
    auth_tokens_file: Path | None = Field(None, description="File of accepted tokens, one per line ('#' comments).")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Extra Host header values accepted over HTTP (e.g. a proxy's name)."
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
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
    http_max_connections: int | None = Field(
        None, ge=1, description="Open HTTP connections; default 2 x sessions per client x tokens + 32."
    )
    log_level: str = Field(
        "INFO", description="Log level; logs go to stderr (a server over HTTP: one access line per request at INFO)."
    )
    metrics_public: bool = Field(
        False, description="GET /metrics answers without the bearer token (a scraper on a private network)."
    )
    model_prices: Annotated[dict[str, ModelPrice], NoDecode] = Field(
        default_factory=dict,
        description='Prices per model, USD per million tokens: {"model": {"input": 3, "cached_input": 0.3, "output": 15}}.',
    )

    @field_validator("allowed_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]
        return value

    @field_validator("allowed_url_addresses", mode="after")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        for item in value:  # a bad one stops the start
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network such as 127.0.0.1 or 10.0.0.0/8") from None
        return value

    @field_validator(
        "allowed_sub_models", "auth_tokens", "allowed_hosts", "allowed_origins", "allowed_url_addresses", mode="before"
    )
    @classmethod
    def _split_models(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [m.strip() for m in value.split(",") if m.strip()]
        return value

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
        if isinstance(value, str):
            name = f"RLM_MCP_{(info.field_name or '').upper()}"
            value = value.strip()
            if not value:
                return {} if info.field_name == "extra_body" else None
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{name} must be a JSON object: {exc}") from exc
            if not isinstance(parsed, dict):
                raise ValueError(f"{name} must be a JSON object")
            return parsed
        return value

    @model_validator(mode="after")
    def _derive_max_context_bytes(self) -> Settings:
        if self.max_context_bytes == 0:
            self.max_context_bytes = max(sandbox_usable_bytes(self.sandbox_memory) // TEXT_MEMORY_FACTOR, 1 << 20)
        return self

    @field_validator("sandbox_memory", "sandbox_tmpfs", "sandbox_shm", mode="after")
    @classmethod
    def _check_size(cls, value: str) -> str:
        parse_size(value)  # fail at start-up, not at the first sandbox
        return value

    @field_validator("database_url", mode="after")
    @classmethod
    def _check_database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None  # an empty variable: the embedded store
        check_database_url(value.get_secret_value())  # never echoes the value: it may carry a password
        return value

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

    @field_validator("prompt_profile", mode="after")
    @classmethod
    def _check_prompt_file(cls, value: str) -> str:
        path = prompt_file_path(value)
        if path is not None:
            try:
                read_prompt_file(path)  # at start, not at the first run
            except PromptFileError as exc:
                raise ValueError(f"{exc}; give a regular UTF-8 text file of at most {MAX_PROMPT_BYTES} bytes") from None
        return value

    @field_validator("base_url", mode="after")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        return check_endpoint_url(value)

    @field_validator("data_dir", mode="after")
    @classmethod
    def _expand_data_dir(cls, value: Path) -> Path:
        return value.expanduser()

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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, FormFieldsFilled(settings_cls, env_settings)]
        toml_path = os.environ.get(CONFIG_VAR)
        if toml_path:
            path = Path(toml_path).expanduser()
            check_config_file(path, settings_cls.model_fields)
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def load_settings(**overrides: Any) -> Settings:
    """`Settings(**overrides)`, with a bad value reported as one line per setting (`SettingsError`)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, Settings.model_fields)) from None


def parse_size(text: str) -> int:
    """'256m' -> bytes. Docker's units: b, k, m, g (powers of 1024), an optional trailing 'b'."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)b?\s*", text.lower())
    if match is None:
        raise ValueError(f"{text!r} is not a size such as 512m or 2g")
    return int(float(match[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match[2]])
