"""One builder per role: what an `RlmService` runs on in this process (rlm_mcp/assembly/)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import anyio

from rlm_mcp.access import webhook_grants
from rlm_mcp.config import Settings, Transport
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.lm.client import LMClient
from rlm_mcp.ports.runs import RunEnded, RunEndHook
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.backends import RunBackend
from rlm_mcp.service.contexts import ContextLoader
from rlm_mcp.service.loaders.addresses import AddressPolicy, parse_networks
from rlm_mcp.service.parts import RunsOpener, ServiceParts, Sessions
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.service.service import RlmService
from rlm_mcp.service.sessions import SessionManager
from rlm_mcp.service.webhooks import Webhooks
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.factory import embedded_stores, team_stores

if TYPE_CHECKING:
    from rlm_mcp.service.team_sessions import TeamSessions  # team mode only: it needs the team extra
    from rlm_mcp.store.pg import PgStores

__all__ = [
    "build_service",
    "embedded",
    "front",
    "make_stores",
    "run_ends",
    "service_parts",
    "team_sessions",
    "webhooks",
    "worker",
]

QUEUE_POOL_SIZE = 4  # the run queue's own connections (team mode)


def build_service(settings: Settings, *, mode: Transport = "stdio", parts: ServiceParts | None = None) -> RlmService:
    """The service of this process's role, its parts built (nothing opened yet: `async with`).
    `parts`: ones the caller built with `service_parts` to share their stores (the HTTP app's
    viewer reads the same run records); by default the role's own."""
    return RlmService(
        settings.service, parts if parts is not None else service_parts(settings, transport=mode), mode=mode
    )


def service_parts(settings: Settings, *, transport: Transport) -> ServiceParts:
    """The parts of the role `settings.deployment` names."""
    deployment = settings.deployment
    if deployment.database is None:
        return embedded(settings, transport=transport)
    # A replica that executes runs keeps a store connection per run slot open: each running run
    # writes its log on its own connection (store/pg/__init__.py `make_pg_stores`).
    warm = settings.runs.max_runs if deployment.executes_runs else 1
    stores = team_stores(settings.store, deployment.database, replica=True, blobs=settings.blobs, warm=warm)
    if deployment.role == "worker":
        return worker(settings, stores)
    return front(settings, stores, transport=transport)  # a front, or `both` (a front that executes)


def embedded(settings: Settings, *, transport: Transport) -> ServiceParts:
    """One process: SQLite and files, runs executed here by the local `RunManager`, kept sessions
    held here (`SessionManager`)."""
    stores = embedded_stores(settings.store)
    sandboxes = SandboxManager(settings.sandbox)
    owners = configured_owners(settings.server)  # the slots' share per owner, counted once
    lm = LMClient(settings.lm, routing=settings.routing)
    hooks = webhooks(settings, stores)
    runs = RunManager(
        settings.runs, stores.contexts, stores.runs, owners=owners, ends=run_ends(hooks.on_run_end, lm=lm)
    )
    sessions = SessionManager(settings.kept_sessions, stores.contexts, sandboxes, runs)

    async def open_runs(stack: AsyncExitStack, engine: Callable[[], Awaitable[RLMEngine]]) -> RunBackend:
        return await stack.enter_async_context(runs)

    return _parts(settings, transport, stores, sandboxes, open_runs, sessions, lm, hooks)


def front(settings: Settings, stores: PgStores, *, transport: Transport) -> ServiceParts:
    """Team mode's MCP replica: runs go through the queue on PostgreSQL (with `--role both`, this
    process also claims and executes them)."""
    return _team(settings, transport, stores, follows=True)


def worker(settings: Settings, stores: PgStores) -> ServiceParts:
    """Team mode's worker: claims queued runs and executes them. It answers no MCP client, so the
    HTTP rules apply to what it loads. It builds no front: nothing here follows a run."""
    return _team(settings, "http", stores, follows=False)


def _team(settings: Settings, transport: Transport, stores: PgStores, *, follows: bool) -> ServiceParts:
    """The shared store and the run queue on PostgreSQL (service/queue); this process claims and
    executes runs when `settings.deployment.executes_runs` says so, and enqueues and follows runs
    when `follows` (a front). Only team stores reach here (`PgStores`): the embedded deployment
    has none to give."""
    from rlm_mcp.lm.throttle_board import ThrottleBoard, publish_states
    from rlm_mcp.service.queue import WorkerParts, open_front, open_queue, queue_rules
    from rlm_mcp.service.queue.liveness import LeaseLiveness
    from rlm_mcp.service.queue.local import LocalLane
    from rlm_mcp.service.queue.sessions import WorkerSessions
    from rlm_mcp.service.team_sessions import TeamSessions
    from rlm_mcp.store.pg.db import Database
    from rlm_mcp.store.pg.queue import PgRunQueue
    from rlm_mcp.store.pg.sessions import PgSessionStore
    from rlm_mcp.store.pg.throttle import THROTTLE_STATE_CHANNEL, PgThrottleChannel

    run_store = stores.run_rows
    # A stopped sandbox is reaped only once its owner's worker lease has lapsed.
    liveness = LeaseLiveness()
    sandboxes = SandboxManager(settings.sandbox, liveness=liveness)
    session_store = PgSessionStore(stores.db, stores.bucket)
    # The sessions whose sandboxes this process holds between runs, where it executes runs (the
    # worker enters them); the database holds every session's state for any replica.
    kept = settings.kept_sessions
    held = WorkerSessions(kept, session_store, stores.contexts) if settings.deployment.executes_runs else None
    sessions = TeamSessions(settings.sessions, session_store, held)

    lm = LMClient(settings.lm, routing=settings.routing)
    hooks = webhooks(settings, stores)
    ends = run_ends(hooks.on_run_end, lm=lm)

    async def open_runs(stack: AsyncExitStack, engine: Callable[[], Awaitable[RLMEngine]]) -> RunBackend:
        # The queue's own small pool: heartbeats and claims never wait behind the run logs' writes
        # on the store's pool (a heartbeat starved past the lease would pause every run here).
        # Its statements (a worker's heartbeat every lease/3) stand for the health route's own.
        queue_db = Database(stores.team.dsn, replica=False, max_size=QUEUE_POOL_SIZE, answers=stores.db.answers)
        await queue_db.open()
        stack.push_async_callback(queue_db.close)
        queue = PgRunQueue(queue_rules(settings.queue), queue_db)
        shared = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(shared.cancel_scope.cancel)
        states = PgThrottleChannel(stores.db, THROTTLE_STATE_CHANNEL)
        if settings.deployment.executes_runs:
            # The processes that call the LM share what the endpoints answer about load (lm/throttle.py)
            # and announce their limits to the fronts' viewers (lm/throttle_board.py).
            shared.start_soon(lm.throttles.share, PgThrottleChannel(stores.db))
            shared.start_soon(publish_states, lm.throttles, states)
        if follows:  # a front's viewer shows the workers' limits
            board = ThrottleBoard()
            lm.throttles.team_view = board.states
            shared.start_soon(board.listen, states)
        worker = WorkerParts(stores.contexts, run_store, run_store, held) if held is not None else None
        # `both`: the runs this front starts go to its own worker first (service/queue/local.py).
        lane = None
        if follows and worker is not None and settings.queue.queue_local_first:
            lane = LocalLane(window_s=settings.queue.queue_poll_s)
        executed = await open_queue(
            stack, settings.queue, queue, sandboxes, engine, worker=worker, liveness=liveness, ends=ends, lane=lane
        )
        if follows or executed is None:
            front = await open_front(stack, settings.queue, queue, ends=ends, lane=lane)
            sessions.queue_through(front)
            return front
        return executed  # a worker-only process: nothing here follows a run

    return _parts(settings, transport, stores, sandboxes, open_runs, sessions, lm, hooks)


def _parts(
    settings: Settings,
    transport: Transport,
    stores: Stores,
    sandboxes: SandboxManager,
    open_runs: RunsOpener,
    sessions: Sessions,
    lm: LMClient,
    hooks: Webhooks,
) -> ServiceParts:
    sandboxes.reclaim = sessions.reclaim  # idle sessions yield their slots to runs (the one place it is set)
    return ServiceParts(
        stores=stores,
        lm=lm,
        sandboxes=sandboxes,
        # Over stdio the client is the machine's own user: loopback URLs are theirs to load.
        loader=ContextLoader(
            stores.contexts, loads=settings.loads, store=settings.store, allow_loopback_urls=(transport == "stdio")
        ),
        sessions=sessions,
        open_runs=open_runs,
        webhooks=hooks,
        engine=settings.engine,
    )


def team_sessions(settings: Settings, stores: PgStores) -> TeamSessions:
    """Team mode's sessions over `stores` without a queue or a worker: what the CLI's read-only
    `sessions list|close` need."""
    from rlm_mcp.service.team_sessions import TeamSessions
    from rlm_mcp.store.pg.sessions import PgSessionStore

    return TeamSessions(settings.sessions, PgSessionStore(stores.db, stores.bucket))


def make_stores(settings: Settings, *, replica: bool = False) -> Stores:
    """The stores of this deployment (`settings.deployment`), for the operator's one-off commands
    (not a replica unless `replica`: no heartbeat, no cache sweep)."""
    database = settings.deployment.database
    if database is None:
        return embedded_stores(settings.store)
    return team_stores(settings.store, database, replica=replica, blobs=settings.blobs)


def run_ends(*hooks: RunEndHook, lm: LMClient | None = None) -> RunEnds:
    """The run-end hook's registry of this process (`service.run_ends`): the work hung on every
    run's end subscribes here: the webhook outbox (`webhooks`), then the router's finish-session
    call (when `RLM_MCP_ROUTER_SESSIONS` says the routers count sessions: lm/router_sessions.py).
    The router's finish also hears runs withdrawn before they were accepted. The kept sessions
    still take their runs' ends through the run manager's session hooks."""
    ends = RunEnds(hooks)
    if lm is not None and lm.routing_settings.router_sessions:
        client = lm

        async def finish_router_sessions(ended: RunEnded) -> None:
            await client.finish_sessions(ended.run_id)

        ends.subscribe(finish_router_sessions)
        # a withdrawn run's first request may have gone out beside its refused record
        ends.subscribe_withdrawn(client.finish_sessions)
    return ends


def webhooks(settings: Settings, stores: Stores) -> Webhooks:
    """Run ends' webhooks: the owners' grants from the tokens file, the stores' outbox, the URL
    loader's address rules for callbacks (`service.webhooks`)."""
    try:
        grants = webhook_grants(settings.server)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if str(exc).startswith("RLM_MCP_WEBHOOK_"):
            what, fix = "The webhook settings are not usable", "Fix RLM_MCP_WEBHOOK_SECRET / RLM_MCP_WEBHOOK_ALLOW."
        else:
            what, fix = "The tokens file's webhook options are not usable", "Fix RLM_MCP_AUTH_TOKENS_FILE."
        raise RlmMcpError(f"{what}: {exc}", fix) from None
    policy = AddressPolicy(
        private=settings.loads.allow_private_urls, listed=tuple(parse_networks(settings.loads.allowed_url_addresses))
    )
    return Webhooks(stores.webhooks, grants, settings.events, policy)
