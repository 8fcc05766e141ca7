"""One settings model for the whole server, made of sections.

Values come from, highest first: explicit keyword arguments (the CLI passes its flags this
way), environment variables `RLM_MCP_*`, an optional TOML file (`RLM_MCP_CONFIG`), defaults.
Layers never read the environment themselves: they are handed a `Settings`, or the section they
need.

Each section is a model that owns its fields and their validators: `lm.py` (LM endpoints),
`loop.py` (one run), `sandbox.py`, `runs.py` (run slots and records; kept sessions), `store.py`
(stores; what loads may read), `team.py` (team mode and the `Deployment` it decides), `blobs.py` (team mode's bytes: rows or a bucket), `server.py`
(transport, HTTP, access, logs). `Settings` is all of them at once: every setting keeps its one
flat name (`RLM_MCP_MAX_SANDBOXES`, TOML key `max_sandboxes`, `Settings(max_sandboxes=2)`,
`settings.model_copy(update={"max_sandboxes": 2})`), and `settings.sandbox` is the sandbox
section alone, what `SandboxManager` takes. A component typed with its section accepts a whole
`Settings` too (a `Settings` is each of its sections).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, PrivateAttr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from rlm_mcp.config.blobs import BlobSettings
from rlm_mcp.config.lm import CompletionTokensField, LMSettings, ModelPrice
from rlm_mcp.config.loop import LoopSettings
from rlm_mcp.config.runs import RunSettings, SessionSettings
from rlm_mcp.config.sandbox import (
    DEFAULT_IMAGE,
    TEXT_MEMORY_FACTOR,
    SandboxSettings,
    sandbox_usable_bytes,
)
from rlm_mcp.config.server import ServerSettings, Transport
from rlm_mcp.config.store import LoadSettings, StoreSettings
from rlm_mcp.config.team import Deployment, Role, TeamSettings
from rlm_mcp.config.values import parse_size, server_of
from rlm_mcp.config_check import CONFIG_VAR, SettingsError, check_config_file, describe_validation_error
from rlm_mcp.config_forms import FormFieldsFilled

__all__ = [
    "DEFAULT_IMAGE",
    "SECTIONS",
    "TEXT_MEMORY_FACTOR",
    "BlobSettings",
    "CompletionTokensField",
    "Deployment",
    "LMSettings",
    "LoadSettings",
    "LoopSettings",
    "ModelPrice",
    "Role",
    "RunSettings",
    "SandboxSettings",
    "ServerSettings",
    "SessionSettings",
    "Settings",
    "StoreSettings",
    "TeamSettings",
    "Transport",
    "load_settings",
    "parse_size",
    "sandbox_usable_bytes",
    "server_of",
]

_Section = TypeVar("_Section", bound=BaseModel)


class Settings(
    ServerSettings,
    TeamSettings,
    BlobSettings,
    LoadSettings,
    StoreSettings,
    SessionSettings,
    RunSettings,
    SandboxSettings,
    LoopSettings,
    LMSettings,
    BaseSettings,
):
    """Every knob of rlm-mcp: the union of the sections. The docs' configuration table is
    generated from its fields (tools/docs_pages.py), grouped by section."""

    model_config = SettingsConfigDict(env_prefix="RLM_MCP_", extra="ignore", validate_default=True)

    # Whether RLM_MCP_MAX_CONTEXT_BYTES was derived from RLM_MCP_SANDBOX_MEMORY (left at 0): a
    # refusal then names the memory, the setting to change.
    _context_limit_follows_memory: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _derive_max_context_bytes(self) -> Settings:
        # Across two sections: the store's largest context follows the sandbox's memory.
        if self.max_context_bytes == 0:
            self.max_context_bytes = self._memory_context_limit()
            self._context_limit_follows_memory = True
        return self

    def _memory_context_limit(self) -> int:
        return max(sandbox_usable_bytes(self.sandbox_memory) // TEXT_MEMORY_FACTOR, 1 << 20)

    @property
    def context_limit_follows_memory(self) -> bool:
        """RLM_MCP_MAX_CONTEXT_BYTES is the one RLM_MCP_SANDBOX_MEMORY gives (it was left at 0;
        and no copy has set another since)."""
        return self._context_limit_follows_memory and self.max_context_bytes == self._memory_context_limit()

    def _section(self, section: type[_Section]) -> _Section:
        # The values are this model's, already validated: the section is built without checks.
        return section.model_construct(**{name: getattr(self, name) for name in section.model_fields})

    @property
    def lm(self) -> LMSettings:
        return self._section(LMSettings)

    @property
    def loop(self) -> LoopSettings:
        return self._section(LoopSettings)

    @property
    def sandbox(self) -> SandboxSettings:
        return self._section(SandboxSettings)

    @property
    def runs(self) -> RunSettings:
        return self._section(RunSettings)

    @property
    def sessions(self) -> SessionSettings:
        return self._section(SessionSettings)

    @property
    def store(self) -> StoreSettings:
        return self._section(StoreSettings)

    @property
    def loads(self) -> LoadSettings:
        return self._section(LoadSettings)

    @property
    def team(self) -> TeamSettings:
        return self._section(TeamSettings)

    @property
    def blobs(self) -> BlobSettings:
        return self._section(BlobSettings)

    @property
    def server(self) -> ServerSettings:
        return self._section(ServerSettings)

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


# Each section's name (the `Settings` property) and model, in the order the docs list them.
SECTIONS: dict[str, type[BaseModel]] = {
    "lm": LMSettings,
    "loop": LoopSettings,
    "sandbox": SandboxSettings,
    "runs": RunSettings,
    "sessions": SessionSettings,
    "store": StoreSettings,
    "loads": LoadSettings,
    "team": TeamSettings,
    "blobs": BlobSettings,
    "server": ServerSettings,
}


def load_settings(**overrides: Any) -> Settings:
    """`Settings(**overrides)`, with a bad value reported as one line per setting (`SettingsError`)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, Settings.model_fields)) from None
