"""Where runs execute: the one choice between the local `RunManager` and the team-mode queue.

`RlmService` talks to a `RunBackend` and never asks which one it holds. The embedded default
(no RLM_MCP_DATABASE_URL) runs everything in this process, as before; team mode goes through
the run queue on PostgreSQL (`service.queue`), whatever the role, so any replica's worker may
take a run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Protocol

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import OwnerScope
from rlm_mcp.ports.owners import OwnerLiveness
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.runs import ActiveRun, RunManager
from rlm_mcp.store.bundle import Stores


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
    if settings.database_url is None:
        return settings
    return settings.model_copy(update={"role": "front"})


def sandbox_liveness(settings: Settings) -> OwnerLiveness | None:
    """Who may reap a stopped sandbox: team mode judges by the workers' leases."""
    if settings.database_url is None:
        return None
    from rlm_mcp.service.queue.liveness import LeaseLiveness

    return LeaseLiveness()


async def open_runs(
    stack: AsyncExitStack,
    settings: Settings,
    stores: Stores,
    sandboxes: SandboxManager,
    engine: Callable[[], Awaitable[RLMEngine]],
) -> RunBackend:
    """The run backend `settings` select, entered on `stack` (closed with it)."""
    if settings.database_url is None:
        return await stack.enter_async_context(RunManager(settings, stores.contexts, stores.runs))
    from rlm_mcp.service.queue import open_queue

    return await open_queue(stack, settings, stores, sandboxes, engine)
