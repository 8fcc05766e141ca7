"""Where runs execute, as `RlmService` sees it: a `RunBackend`, the local `RunManager` or the
team-mode queue, chosen by the assembly (rlm_mcp/assembly/) for this process's role.

`RlmService` talks to a `RunBackend` and never asks which one it holds. The embedded default
(no RLM_MCP_DATABASE_URL) runs everything in this process; team mode goes through the run queue
on PostgreSQL (`service.queue`), whatever the role, so any replica's worker may take a run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import OwnerScope
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.service.active_run import ActiveRun


class RunBackend(Protocol):
    # True: runs execute in this process (starting one needs the engine and a ready sandbox backend).
    local: bool

    def get(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """A run this process already follows; None otherwise (or another owner's)."""
        ...

    async def find(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """The live run, wherever it executes; None when unknown, another owner's or ended."""
        ...

    async def start(self, request: RunRequest, engine: RLMEngine | None) -> ActiveRun: ...

    async def cancel(self, run_id: str, *, wait_s: float = 5.0) -> None: ...


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
