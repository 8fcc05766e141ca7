"""One builder per role: what an `RlmService` runs on in this process (rlm_mcp/assembly/)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from rlm_mcp.config import Settings, Transport
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.lm.client import LMClient
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.backends import RunBackend
from rlm_mcp.service.contexts import ContextLoader
from rlm_mcp.service.parts import RunsOpener, ServiceParts
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.runs import RunManager
from rlm_mcp.service.service import RlmService
from rlm_mcp.service.sessions import SessionManager
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.factory import embedded_stores, team_stores

if TYPE_CHECKING:
    from rlm_mcp.service.team_sessions import TeamSessions  # team mode only: it needs the team extra

__all__ = ["build_service", "embedded", "front", "service_parts", "worker"]


def build_service(settings: Settings, *, mode: Transport = "stdio", stores: Stores | None = None) -> RlmService:
    """The service of this process's role, its parts built (nothing opened yet: `async with`).
    `stores`: a bundle the caller shares with the service (the HTTP app's viewer reads the same
    run records); by default the role's own."""
    return RlmService(settings, service_parts(settings, transport=mode, stores=stores), mode=mode)


def service_parts(settings: Settings, *, transport: Transport, stores: Stores | None = None) -> ServiceParts:
    """The parts of the role `settings.deployment` names."""
    deployment = settings.deployment
    if deployment.embedded:
        return embedded(settings, transport=transport, stores=stores)
    if deployment.role == "worker":
        return worker(settings, stores=stores)
    return front(settings, transport=transport, stores=stores)  # a front, or `both` (a front that executes)


def embedded(settings: Settings, *, transport: Transport, stores: Stores | None = None) -> ServiceParts:
    """One process: SQLite and files, runs executed here by the local `RunManager`."""
    stores = stores if stores is not None else embedded_stores(settings.store)
    own = stores

    ends = run_ends()

    async def open_runs(stack: AsyncExitStack, engine: Callable[[], Awaitable[RLMEngine]]) -> RunBackend:
        return await stack.enter_async_context(RunManager(settings, own.contexts, own.runs, ends=ends))

    return _parts(settings, transport, stores, SandboxManager(settings.sandbox), open_runs)


def front(settings: Settings, *, transport: Transport, stores: Stores | None = None) -> ServiceParts:
    """Team mode's MCP replica: runs go through the queue on PostgreSQL (with `--role both`, this
    process also claims and executes them)."""
    return _team(settings, transport, stores)


def worker(settings: Settings, *, stores: Stores | None = None) -> ServiceParts:
    """Team mode's worker: claims queued runs and executes them. It answers no MCP client, so the
    HTTP rules apply to what it loads."""
    return _team(settings, "http", stores)


def _team(settings: Settings, transport: Transport, stores: Stores | None) -> ServiceParts:
    """The shared store and the run queue; `settings.deployment.executes_runs` says whether this
    process claims runs (service/queue)."""
    _require_team(settings)
    from rlm_mcp.service.queue import open_queue
    from rlm_mcp.service.queue.liveness import LeaseLiveness
    from rlm_mcp.service.team_sessions import team_sessions_for

    stores = stores if stores is not None else team_stores(settings.store, settings.team, replica=True)
    own = stores
    # A stopped sandbox is reaped only once its owner's worker lease has lapsed.
    sandboxes = SandboxManager(settings.sandbox, liveness=LeaseLiveness())

    ends = run_ends()

    async def open_runs(stack: AsyncExitStack, engine: Callable[[], Awaitable[RLMEngine]]) -> RunBackend:
        return await open_queue(stack, settings, own, sandboxes, engine, ends=ends)

    return _parts(settings, transport, stores, sandboxes, open_runs, team_sessions_for(settings, stores))


def _parts(
    settings: Settings,
    transport: Transport,
    stores: Stores,
    sandboxes: SandboxManager,
    open_runs: RunsOpener,
    team_sessions: TeamSessions | None = None,
) -> ServiceParts:
    sessions = SessionManager(settings, stores.contexts)
    sandboxes.reclaim = sessions.reclaim  # idle sessions yield their slots to runs
    return ServiceParts(
        stores=stores,
        lm=LMClient(settings.lm),
        sandboxes=sandboxes,
        # Over stdio the client is the machine's own user: loopback URLs are theirs to load.
        loader=ContextLoader(
            stores.contexts, loads=settings.loads, store=settings.store, allow_loopback_urls=(transport == "stdio")
        ),
        sessions=sessions,
        open_runs=open_runs,
        team_sessions=team_sessions,
    )


def run_ends() -> RunEnds:
    """The run-end hook's registry of this process (`service.run_ends`): the work hung on every
    run's end subscribes here. None yet: the kept sessions still take their runs' ends through
    the run manager's session hooks; the router's finish-session call, webhooks and MCP task
    state are the next subscribers."""
    return RunEnds()


def _require_team(settings: Settings) -> None:
    if settings.deployment.embedded:
        raise RlmMcpError(
            "A team front or worker needs the shared database.",
            "Set RLM_MCP_DATABASE_URL=postgresql://user:password@host:port/db (docs/team.md).",
        )
