"""One settings model for the whole server, made of sections.

Values come from, highest first: explicit keyword arguments (the CLI passes its flags this
way), environment variables `RLM_MCP_*`, an optional TOML file (`RLM_MCP_CONFIG`), defaults.
Layers never read the environment themselves: they are handed a `Settings`, or the section they
need.

Each section is a model that owns its fields and their validators: `lm.py` (LM endpoints),
`routing.py` (what routers are told; back-pressure), `loop.py` (one run), `sandbox.py`, `runs.py` (run slots and records; kept sessions), `store.py`
(stores; what loads may read), `team.py` (team mode and the `Deployment` it decides), `blobs.py` (team mode's bytes: rows or a
bucket), `server.py`
(transport, HTTP, access, logs), `publish.py` (how often a worker writes a live summary),
`events.py` (run event streams, webhooks). `Settings` holds one of each, as fields (the one list of
sections: a new section is one field; `SECTIONS` and `FlatSettings` follow): `settings.sandbox` is what
`SandboxManager` takes. Every setting keeps its one flat name (`RLM_MCP_MAX_SANDBOXES`, TOML key
`max_sandboxes`, `Settings(max_sandboxes=2)`, `settings.model_copy(update={"max_sandboxes": 2})`),
routed to the section that owns it. What cuts across sections is derived here as a small frozen
value (`settings.engine`, `.queue`, `.kept_sessions`, `.service`) for the assembly to hand down.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from rlm_mcp.config.blobs import BlobSettings
from rlm_mcp.config.derived import EngineSettings, KeptSessionSettings, QueueSettings, ServiceSettings
from rlm_mcp.config.events import EventSettings
from rlm_mcp.config.lm import CompletionTokensField, LMSettings, ModelPrice
from rlm_mcp.config.loop import LoopSettings
from rlm_mcp.config.publish import PublishSettings
from rlm_mcp.config.routing import RoutingSettings
from rlm_mcp.config.runs import RunSettings, SessionSettings
from rlm_mcp.config.sandbox import (
    DEFAULT_IMAGE,
    TEXT_MEMORY_FACTOR,
    SandboxSettings,
    sandbox_usable_bytes,
)
from rlm_mcp.config.server import ServerSettings, Transport
from rlm_mcp.config.store import LoadSettings, StoreSettings
from rlm_mcp.config.team import Deployment, Role, TeamDatabase, TeamSettings
from rlm_mcp.config.values import parse_size, server_of
from rlm_mcp.config_check import CONFIG_VAR, SettingsError, check_config_file, describe_validation_error
from rlm_mcp.config_forms import FormFieldsFilled

__all__ = [
    "DEFAULT_IMAGE",
    "SECTIONS",
    "SETTING_FIELDS",
    "TEXT_MEMORY_FACTOR",
    "BlobSettings",
    "CompletionTokensField",
    "Deployment",
    "EngineSettings",
    "EventSettings",
    "FlatSettings",
    "KeptSessionSettings",
    "LMSettings",
    "LoadSettings",
    "LoopSettings",
    "ModelPrice",
    "PublishSettings",
    "QueueSettings",
    "Role",
    "RoutingSettings",
    "RunSettings",
    "SandboxSettings",
    "ServerSettings",
    "ServiceSettings",
    "SessionSettings",
    "Settings",
    "StoreSettings",
    "TeamDatabase",
    "TeamSettings",
    "Transport",
    "load_settings",
    "parse_size",
    "sandbox_usable_bytes",
    "server_of",
]


def _routed(values: dict[str, Any]) -> dict[str, Any]:
    """Flat names (`max_sandboxes`) gathered under the section that owns each (`sandbox`); a
    section given whole passes as it is; a name no section owns is dropped (the environment holds
    other variables)."""
    routed: dict[str, Any] = {}
    per_section: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for key, value in values.items():
        if key in SECTIONS:
            routed[key] = value
        elif (owner := _OWNER.get(key)) is not None:
            per_section[owner][key] = value
    for name, flat in per_section.items():
        if name not in routed:
            routed[name] = flat
        elif flat:  # a section given whole and flat names of it: the flat names win
            given = routed[name]
            routed[name] = given.model_copy(update=flat) if isinstance(given, BaseModel) else {**given, **flat}
    return routed


class Settings(BaseSettings):
    """Every knob of rlm-mcp, as its sections: `settings.sandbox` is what `SandboxManager` takes,
    `settings.lm` what `LMClient` takes. Each setting keeps its one flat name everywhere an
    operator or a script writes it (`RLM_MCP_MAX_SANDBOXES`, TOML `max_sandboxes`,
    `Settings(max_sandboxes=2)`, `settings.model_copy(update={"max_sandboxes": 2})`); a flat
    read (`settings.max_sandboxes`) still answers at run time, for scripts, but typed code reads
    the section. The docs' configuration table is generated per section (tools/docs_pages.py)."""

    model_config = SettingsConfigDict(env_prefix="RLM_MCP_", extra="ignore", validate_default=True)

    lm: LMSettings = Field(default_factory=LMSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    loop: LoopSettings = Field(default_factory=LoopSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    runs: RunSettings = Field(default_factory=RunSettings)
    sessions: SessionSettings = Field(default_factory=SessionSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    loads: LoadSettings = Field(default_factory=LoadSettings)
    team: TeamSettings = Field(default_factory=TeamSettings)
    blobs: BlobSettings = Field(default_factory=BlobSettings)
    publish: PublishSettings = Field(default_factory=PublishSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    events: EventSettings = Field(default_factory=EventSettings)

    # Whether RLM_MCP_MAX_CONTEXT_BYTES was derived from RLM_MCP_SANDBOX_MEMORY (left at 0): a
    # refusal then names the memory, the setting to change.
    _context_limit_follows_memory: bool = PrivateAttr(default=False)

    @model_validator(mode="before")
    @classmethod
    def _route_flat_names(cls, data: Any) -> Any:
        return _routed(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _derive_max_context_bytes(self) -> Settings:
        # Across two sections: the store's largest context follows the sandbox's memory.
        if self.store.max_context_bytes == 0:
            self.store = self.store.model_copy(update={"max_context_bytes": self._memory_context_limit()})
            self._context_limit_follows_memory = True
        return self

    def _memory_context_limit(self) -> int:
        return max(sandbox_usable_bytes(self.sandbox.sandbox_memory) // TEXT_MEMORY_FACTOR, 1 << 20)

    @property
    def context_limit_follows_memory(self) -> bool:
        """RLM_MCP_MAX_CONTEXT_BYTES is the one RLM_MCP_SANDBOX_MEMORY gives (it was left at 0;
        and no copy has set another since)."""
        return self._context_limit_follows_memory and self.store.max_context_bytes == self._memory_context_limit()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; `update` may name settings by their flat names (`{"max_sandboxes": 2}`), each
        going to its section (the values are not validated, as pydantic's own copy)."""
        if not update:
            return super().model_copy(deep=deep)
        routed: dict[str, Any] = {}
        per_section: dict[str, dict[str, Any]] = {}
        for key, value in update.items():
            owner = _OWNER.get(key)
            if owner is None:
                routed[key] = value
            else:
                per_section.setdefault(owner, {})[key] = value
        for name, flat in per_section.items():
            routed[name] = getattr(self, name).model_copy(update=flat)
        return super().model_copy(update=routed, deep=deep)

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # A flat read (`settings.max_sandboxes`), for scripts: the owning section's value.
            owner = _READS.get(name)
            if owner is not None:
                return getattr(self.__dict__[owner], name)
            return super().__getattr__(name)

    @property
    def model_fields_set(self) -> set[str]:
        """The settings given explicitly (a keyword, the environment, the file), by their flat names."""
        return {name for section in SECTIONS for name in getattr(self, section).model_fields_set}

    @property
    def deployment(self) -> Deployment:
        """The one decision of the mode and role (config/team.py)."""
        return self.team.deployment

    @property
    def engine(self) -> EngineSettings:
        """What the RLM engine reads, across four sections (config/derived.py)."""
        return EngineSettings.of(self.lm, self.loop, self.sandbox, self.runs)

    @property
    def kept_sessions(self) -> KeptSessionSettings:
        """What the kept sessions' managers read, across three sections (config/derived.py)."""
        return KeptSessionSettings.of(self.sessions, self.store, self.sandbox)

    @property
    def service(self) -> ServiceSettings:
        """What the service reads itself, across sections (config/derived.py)."""
        return ServiceSettings(
            loop=self.loop,
            model=self.lm.model,
            data_dir=self.store.data_dir,
            sandbox_memory=self.sandbox.sandbox_memory,
            context_limit_follows_memory=self.context_limit_follows_memory,
        )

    @property
    def queue(self) -> QueueSettings:
        """What team mode's run queue reads, across four sections (config/derived.py)."""
        return QueueSettings(runs=self.runs, team=self.team, server=self.server, publish=self.publish)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The sources read the flat names (FlatSettings' fields); `_route_flat_names` then gathers
        # them into the sections. Keyword arguments are passed through as given.
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            FormFieldsFilled(FlatSettings, EnvSettingsSource(FlatSettings)),
        ]
        toml_path = os.environ.get(CONFIG_VAR)
        if toml_path:
            path = Path(toml_path).expanduser()
            check_config_file(path, SETTING_FIELDS)
            sources.append(TomlConfigSettingsSource(FlatSettings, toml_file=path))
        return tuple(sources)


# Each section's name (its field of `Settings`) and model, in the order the docs list them: read
# from the fields of `Settings`, the one list of sections (a new section is one field there).
SECTIONS: dict[str, type[BaseModel]] = {
    name: cast("type[BaseModel]", field.annotation) for name, field in Settings.model_fields.items()
}


def _flat_settings() -> type[BaseSettings]:
    def body(namespace: dict[str, Any]) -> None:
        namespace["__module__"] = __name__
        namespace["__doc__"] = (
            "Every setting under its one flat name: what the environment (`RLM_MCP_<NAME>`), the TOML "
            "file, the CLI and the error messages speak. Only read for its fields and to parse those "
            "sources; a process holds a `Settings`."
        )
        namespace["model_config"] = Settings.model_config

    # Every section at once, the first listed first among the fields (the bases, last first).
    return types.new_class("FlatSettings", (*reversed(SECTIONS.values()), BaseSettings), exec_body=body)


FlatSettings = _flat_settings()
# Every setting's flat name and field; the section that owns each.
SETTING_FIELDS = FlatSettings.model_fields
_OWNER: dict[str, str] = {name: section for section, model in SECTIONS.items() for name in model.model_fields}
# A flat read may also name a section's derived value (`effective_sub_model`), for scripts.
_READS: dict[str, str] = {
    **{
        name: section
        for section, model in SECTIONS.items()
        for name, v in vars(model).items()
        if isinstance(v, property)
    },
    **_OWNER,
}


def load_settings(**overrides: Any) -> Settings:
    """`Settings(**overrides)`, with a bad value reported as one line per setting (`SettingsError`)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, SETTING_FIELDS)) from None
