"""The settings of the operator's one-off commands (`rlm-mcp run`, `rlm-mcp eval`), derived from
the configured ones: the role such a command takes in team mode, and the paths it may read."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rlm_mcp.config import Settings

__all__ = ["for_one_off_command", "opening_local_paths"]


def for_one_off_command(settings: Settings) -> Settings:
    """The settings of a one-off command (`rlm-mcp run`, `rlm-mcp eval`): in team mode it queues
    its runs as a front, for the team's workers; as a worker it would claim other people's runs
    and cancel them when it exits."""
    if settings.deployment.embedded:
        return settings
    return settings.model_copy(update={"role": "front"})


def opening_local_paths(settings: Settings, paths: Iterable[Path]) -> Settings:
    """The settings of a local command (`rlm-mcp run --path`, `rlm-mcp eval`) that reads the files
    its user named: exactly those paths are open, wherever they lie, and nothing else.

    The one rule for paths: RLM_MCP_ALLOWED_ROOTS bounds what an MCP *client* (acting for a model)
    may ask a server to read; a person typing a local command names files they can read anyway,
    so the command reads those, as them, and the configured roots are not consulted."""
    return settings.model_copy(update={"allowed_roots": sorted({Path(p).resolve() for p in paths})})
