"""The Procrastinate app of one team-mode process: its own small psycopg pool on the team database.

Procrastinate does what it does well here: the durable claim (`fetch_job`: one row locked and
marked `doing` with the claiming worker's id), worker heartbeats, cancel and abort requests (with
their NOTIFY), and finding the jobs of workers whose heartbeat stopped (`get_stalled_jobs`). Its
schema is one rlm-mcp migration (`store.pg.migrations`); the job's only argument is the run id,
since the request lives in the run's record (`rlm_runs.summary`).

Its own pool, not the store's: Procrastinate configures its connections (JSON loaders, row
factory) and the store's pool hands out autocommit connections with a dict row factory of its own.
"""

from __future__ import annotations

from typing import Any

import procrastinate

TASK = "rlm_mcp.run"
QUEUE = "rlm_runs"
POOL_SIZE = 4
CONNECT_TIMEOUT_S = 10


def make_app(url: str) -> procrastinate.App:
    """An app that is not open yet (`await app.open_async()`; `await app.close_async()`)."""
    connector = procrastinate.PsycopgConnector(
        conninfo=url,
        min_size=1,
        max_size=POOL_SIZE,
        timeout=CONNECT_TIMEOUT_S,
        # Procrastinate adds the pool's connection check: a PostgreSQL restart costs a reconnect.
        reconnect_timeout=0,  # keep trying after an outage, never give up
        kwargs={"connect_timeout": CONNECT_TIMEOUT_S},
        name="rlm-mcp-queue",
    )
    return procrastinate.App(connector=connector)


async def defer_run(app: procrastinate.App, run_id: str) -> int:
    """Queue the run; returns its job id. `lock=run_id`: at most one job of a run is `doing`."""
    deferrer: Any = app.configure_task(TASK, queue=QUEUE, lock=run_id)
    job_id: int = await deferrer.defer_async(run_id=run_id)
    return job_id
