"""Team mode's run queue on PostgreSQL: fronts enqueue runs, workers claim and execute them.

- `port.py`: the queue's port and a run's state machine; `state.py`: its one implementation,
  every statement on run state (enqueue, claim, requeue, finish, sweeps), over `registry.py`,
  every statement on worker state (register, heartbeat, leases); `sql.py`: what they share
  (the NOTIFY channels, the database's clock).
- `front.py`: enqueue, follow a run through the database (progress, status, result), cancel.
- `wakeups.py`: one LISTEN connection per process that wakes the tasks following runs.
- `sessions.py`: a worker's kept sessions: the live sandboxes it holds, restores, snapshots.
- `worker.py`: claim a run when slots allow, execute it with the local `RunManager`, report,
  fenced by the claim's attempt; `final_writes.py`: how it writes a run's end through an outage
  (handed back, stopped unrecorded, the final record retried).
- `sweeper.py`: leases: lost workers' runs and sandboxes, runs no worker takes.
- `liveness.py`: which sandbox owners are gone, by the workers' leases.
- `gauges.py`: the queue's depth, oldest age and live workers, sampled for /metrics.
- `ends.py`: a run's request, sandbox need and final summary; each owner's share of the slots.

Roles (RLM_MCP_ROLE): `front` follows and enqueues, `worker` executes, `both` does both; even in
`both` a run goes through the queue, so any replica's worker may take it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.gauges import sample_forever
from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.service.queue.port import RunQueuePort
from rlm_mcp.service.queue.state import PgRunQueue
from rlm_mcp.service.queue.sweeper import Sweeper
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.queue.worker import QueueWorker
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.store.pg.sessions import PgSessionStore

__all__ = ["CLOCK_SKEW_WARN_S", "QueueFront", "QueueWorker", "open_queue", "warn_of_clock_skew"]

log = logging.getLogger("rlm_mcp.queue")

CLOCK_SKEW_WARN_S = 2.0
QUEUE_POOL_SIZE = 4


async def open_queue(
    stack: AsyncExitStack,
    settings: Settings,
    stores: Stores,
    sandboxes: SandboxManager,
    engine: Callable[[], Awaitable[RLMEngine]],
    *,
    ends: RunEnds | None = None,
) -> QueueFront:
    """Open the queue's parts for this process's role on `stack`; returns its front (a worker's
    front is only used by the CLI's one-off calls). `ends`: the run-end hook, told by whichever
    part's write ends a run."""
    db, run_store = stores.lifecycle, stores.runs
    if not isinstance(db, Database) or not isinstance(run_store, PgRunStore) or settings.deployment.embedded:
        raise RlmMcpError("The run queue needs the PostgreSQL store.", "Set RLM_MCP_DATABASE_URL.")
    url = settings.database_dsn()
    # The queue's own small pool: heartbeats and claims never wait behind the run logs' writes
    # on the store's pool (a heartbeat starved past the lease would pause every run here).
    queue_db = Database(url, replica=False, max_size=QUEUE_POOL_SIZE)
    await queue_db.open()
    stack.push_async_callback(queue_db.close)
    queue = PgRunQueue(settings, queue_db)
    await warn_of_clock_skew(queue)
    liveness = sandboxes.liveness if isinstance(sandboxes.liveness, LeaseLiveness) else None
    executes = settings.deployment.executes_runs
    sweeper = Sweeper(settings, queue, sandboxes if executes else None, liveness, ends=ends)
    tg = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(tg.cancel_scope.cancel)  # runs before the group exits (callbacks unwind in reverse)
    tg.start_soon(sweeper.run_forever)
    tg.start_soon(sample_forever, queue)  # the queue gauges of /metrics
    if executes:
        manager = await stack.enter_async_context(RunManager(settings, stores.contexts, run_store, ends=ends))
        worker = QueueWorker(
            settings,
            queue,
            url,
            run_store,
            manager,
            sandboxes,
            engine,
            session_store=PgSessionStore(db),
            contexts=stores.contexts,
            ends=ends,
        )
        await stack.enter_async_context(worker)
    return await stack.enter_async_context(QueueFront(settings, queue, Wakeups(url), ends=ends))


async def warn_of_clock_skew(queue: RunQueuePort) -> float | None:
    """Log a warning when this process's clock and the database's differ by more than
    CLOCK_SKEW_WARN_S: every time replicas compare is the database's, but this process's own
    times (run created_at, log event times) would mislead. Returns the skew (None: unknown)."""
    try:
        skew = await queue.clock_skew_s()
    except Exception as exc:  # the database is restarting: the queue's own calls will say so
        log.info("could not compare this clock with the database's: %s", exc)
        return None
    if abs(skew) > CLOCK_SKEW_WARN_S:
        log.warning(
            "this host's clock is %.1f s %s the database's; fix its time sync (NTP, chrony): run times it "
            "shows will be off (leases and timeouts use the database's clock)",
            abs(skew),
            "ahead of" if skew > 0 else "behind",
        )
    return skew
