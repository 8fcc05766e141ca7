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
from rlm_mcp.service.parts import RunsOpener, ServiceParts, Sessions
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.runs import RunManager
from rlm_mcp.service.service import RlmService
from rlm_mcp.service.sessions import SessionManager
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.factory import embedded_stores, team_stores

if TYPE_CHECKING:
    from rlm_mcp.service.team_sessions import TeamSessions  # team mode only: it needs the team extra

__all__ = ["build_service", "embedded", "front", "run_ends", "service_parts", "team_sessions", "worker"]

QUEUE_POOL_SIZE = 4  # the run queue's own connections (team mode)


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
    """One process: SQLite and files, runs executed here by the local `RunManager`, kept sessions
    held here (`SessionManager`)."""
    stores = stores if stores is not None else embedded_stores(settings.store)
    sandboxes = SandboxManager(settings.sandbox)
    runs = RunManager(settings, stores.contexts, stores.runs, ends=run_ends())
    sessions = SessionManager(settings, stores.contexts, sandboxes, runs)

    async def open_runs(stack: AsyncExitStack, engine: Callable[[], Awaitable[RLMEngine]]) -> RunBackend:
        return await stack.enter_async_context(runs)

    return _parts(settings, transport, stores, sandboxes, open_runs, sessions)


def front(settings: Settings, *, transport: Transport, stores: Stores | None = None) -> ServiceParts:
    """Team mode's MCP replica: runs go through the queue on PostgreSQL (with `--role both`, this
    process also claims and executes them)."""
    return _team(settings, transport, stores, follows=True)


def worker(settings: Settings, *, stores: Stores | None = None) -> ServiceParts:
    """Team mode's worker: claims queued runs and executes them. It answers no MCP client, so the
    HTTP rules apply to what it loads. It builds no front: nothing here follows a run."""
    return _team(settings, "http", stores, follows=False)


def _team(settings: Settings, transport: Transport, stores: Stores | None, *, follows: bool) -> ServiceParts:
    """The shared store and the run queue on PostgreSQL (service/queue); this process claims and
    executes runs when `settings.deployment.executes_runs` says so, and enqueues and follows runs
    when `follows` (a front)."""
    _require_team(settings)
    from rlm_mcp.service.queue import WorkerParts, open_front, open_queue, queue_rules
    from rlm_mcp.service.queue.liveness import LeaseLiveness
    from rlm_mcp.service.queue.sessions import WorkerSessions
    from rlm_mcp.service.team_sessions import TeamSessions
    from rlm_mcp.store.pg import bucket_of
    from rlm_mcp.store.pg.db import Database
    from rlm_mcp.store.pg.queue import PgRunQueue
    from rlm_mcp.store.pg.runs import PgRunStore
    from rlm_mcp.store.pg.sessions import PgSessionStore

    stores = (
        stores if stores is not None else team_stores(settings.store, settings.team, replica=True, blobs=settings.blobs)
    )
    own = stores
    db, run_store = stores.lifecycle, stores.runs
    if not isinstance(db, Database) or not isinstance(run_store, PgRunStore):
        raise RlmMcpError("The run queue needs the PostgreSQL store.", "Set RLM_MCP_DATABASE_URL.")
    # A stopped sandbox is reaped only once its owner's worker lease has lapsed.
    liveness = LeaseLiveness()
    sandboxes = SandboxManager(settings.sandbox, liveness=liveness)
    session_store = PgSessionStore(db, bucket_of(stores))
    # The sessions whose sandboxes this process holds between runs, where it executes runs (the
    # worker enters them); the database holds every session's state for any replica.
    held = WorkerSessions(settings, session_store, stores.contexts) if settings.deployment.executes_runs else None
    sessions = TeamSessions(settings, session_store, held)

    ends = run_ends()

    async def open_runs(stack: AsyncExitStack, engine: Callable[[], Awaitable[RLMEngine]]) -> RunBackend:
        # The queue's own small pool: heartbeats and claims never wait behind the run logs' writes
        # on the store's pool (a heartbeat starved past the lease would pause every run here).
        queue_db = Database(settings.database_dsn(), replica=False, max_size=QUEUE_POOL_SIZE)
        await queue_db.open()
        stack.push_async_callback(queue_db.close)
        queue = PgRunQueue(queue_rules(settings), queue_db)
        worker = WorkerParts(own.contexts, run_store, run_store, held) if held is not None else None
        executed = await open_queue(
            stack, settings, queue, sandboxes, engine, worker=worker, liveness=liveness, ends=ends
        )
        if follows or executed is None:
            front = await open_front(stack, settings, queue, ends=ends)
            sessions.queue_through(front)
            return front
        return executed  # a worker-only process: nothing here follows a run

    return _parts(settings, transport, stores, sandboxes, open_runs, sessions)


def _parts(
    settings: Settings,
    transport: Transport,
    stores: Stores,
    sandboxes: SandboxManager,
    open_runs: RunsOpener,
    sessions: Sessions,
) -> ServiceParts:
    sandboxes.reclaim = sessions.reclaim  # idle sessions yield their slots to runs (the one place it is set)
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
    )


def team_sessions(settings: Settings, stores: Stores) -> TeamSessions:
    """Team mode's sessions over `stores` without a queue or a worker: what the CLI's read-only
    `sessions list|close` need (the caller has checked that the deployment is a team's)."""
    from rlm_mcp.service.team_sessions import TeamSessions
    from rlm_mcp.store.pg import bucket_of
    from rlm_mcp.store.pg.db import Database
    from rlm_mcp.store.pg.sessions import PgSessionStore

    if not isinstance(stores.lifecycle, Database):
        raise RlmMcpError("Team mode's sessions need the PostgreSQL store.", "Set RLM_MCP_DATABASE_URL.")
    return TeamSessions(settings, PgSessionStore(stores.lifecycle, bucket_of(stores)))


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
