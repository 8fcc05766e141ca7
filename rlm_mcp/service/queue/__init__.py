"""Team mode's run queue on PostgreSQL: fronts enqueue runs, workers execute them.

- `app.py`: the Procrastinate app (its own small pool); a job's only argument is the run id.
- `records.py`: the queue's reads and writes of `rlm_runs`/`rlm_workers`, and the NOTIFY wake-up.
- `front.py`: enqueue, follow a run through the database (progress, status, result), cancel.
- `wakeups.py`: one LISTEN connection per process that wakes the tasks following runs.
- `worker.py`: claim a run when slots allow, execute it with the local `RunManager`, report.
- `sweeper.py`: leases: lost workers' runs and sandboxes, runs no worker takes.
- `liveness.py`: which sandbox owners are gone, by the workers' leases.

Roles (RLM_MCP_ROLE): `front` follows and enqueues, `worker` executes, `both` does both; even in
`both` a run goes through the queue, so any replica's worker may take it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.app import make_app
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.service.queue.sweeper import Sweeper
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.queue.worker import QueueWorker
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.runs import PgRunStore

__all__ = ["QueueFront", "QueueWorker", "open_queue"]


async def open_queue(
    stack: AsyncExitStack,
    settings: Settings,
    stores: Stores,
    sandboxes: SandboxManager,
    engine: Callable[[], Awaitable[RLMEngine]],
) -> QueueFront:
    """Open the queue's parts for this process's role on `stack`; returns its front (a worker's
    front is only used by the CLI's one-off calls)."""
    db, run_store = stores.lifecycle, stores.runs
    if not isinstance(db, Database) or not isinstance(run_store, PgRunStore) or settings.database_url is None:
        raise RlmMcpError("The run queue needs the PostgreSQL store.", "Set RLM_MCP_DATABASE_URL.")
    url = settings.database_url.get_secret_value()
    app = make_app(url)
    try:
        await app.open_async()
    except Exception as exc:
        raise db.unavailable(exc) from None
    stack.push_async_callback(app.close_async)
    liveness = sandboxes.liveness if isinstance(sandboxes.liveness, LeaseLiveness) else None
    executes = settings.role in ("worker", "both")
    sweeper = Sweeper(settings, db, app, sandboxes if executes else None, liveness)
    tg = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(tg.cancel_scope.cancel)  # runs before the group exits (callbacks unwind in reverse)
    tg.start_soon(sweeper.run_forever)
    if executes:
        manager = await stack.enter_async_context(RunManager(settings, stores.contexts, run_store))
        await stack.enter_async_context(QueueWorker(settings, db, run_store, app, manager, sandboxes, engine))
    return await stack.enter_async_context(QueueFront(settings, db, run_store, app, Wakeups(url)))
