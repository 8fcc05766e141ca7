"""A replica stopped by a signal says so in the database at once: its replica row goes (its
context pins lapse) and its worker is marked gone (another worker may claim what it preferred).

How such a stop runs (cli/serve.py): the signal cancels the server's main task, which returns,
and asyncio.run's last step cancels every task left, the service's lifespan (which then cleans
up, shielded) and the connection pool's own tasks at once. The pool then lends only a connection
already idle in it; it opens no other. A statement in flight at that moment (a heartbeat, a
worker's timed look) is cancelled and its connection discarded, so the clean-up's statements
found no connection and waited the pool's whole timeout (`CONNECT_TIMEOUT_S`, 10 s) for one
nobody would open, then were dropped: each SIGTERM'd replica of the team e2e tests took 10 s more
to stop, some of the time. Here the pool holds one connection, busy when the stop comes.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import anyio
import psycopg
import pytest

from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from tests.fixtures_store import make_settings

# Long past the pool's own timeout: a clean-up still waiting then has waited it out for nothing.
STOP_BOUND_S = 60.0


async def _stop_while_busy(url: str, tmp_path: Path) -> tuple[str, int]:
    """Open a replica's pool (one connection) and register a worker, then stop as a signal does
    (asyncio.run's last step: every task cancelled at once) while a statement holds the
    connection; returns the replica id and the worker id."""
    db = Database(url, replica=True, max_size=1)
    queue = PgRunQueue(queue_rules(make_settings(tmp_path, database_url=url).queue), db)
    opened, taken = asyncio.Event(), asyncio.Event()
    ids: dict[str, int | str] = {}

    async def lifespan() -> None:
        await db.open()
        worker = await queue.register_worker("owner-stop", 1)
        ids.update(replica=db.replica_id, worker=worker)
        try:
            opened.set()
            await asyncio.Event().wait()  # serves until cancelled
        finally:
            # The service's own order: its worker unregisters (a failure is logged: the sweepers
            # find it silent), then the store closes.
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await queue.unregister_worker(worker)
            await db.close()  # shielded within

    async def statement_in_flight() -> None:
        async with db.connection() as conn:
            taken.set()  # main resumes once this task waits on the server's answer
            await conn.execute("SELECT pg_sleep(600)")

    async def main() -> None:
        asyncio.get_running_loop().create_task(lifespan())
        await opened.wait()
        asyncio.get_running_loop().create_task(statement_in_flight())
        await taken.wait()
        # Returns: asyncio.run cancels the lifespan, the statement and the pool's tasks together.

    await asyncio.wait_for(asyncio.to_thread(asyncio.run, main()), STOP_BOUND_S)
    return str(ids["replica"]), int(ids["worker"])


@pytest.mark.anyio
async def test_a_stopped_replica_leaves_no_replica_row_and_its_worker_is_marked_gone(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    replica_id, worker_id = await _stop_while_busy(pg_migrated_url, tmp_path)
    with psycopg.connect(pg_migrated_url) as conn:
        rows = conn.execute("SELECT count(*) FROM rlm_replicas WHERE replica_id = %s", (replica_id,)).fetchone()
        gone = conn.execute("SELECT gone_at FROM rlm_workers WHERE worker_id = %s", (worker_id,)).fetchone()
    assert rows == (0,)
    assert gone is not None and gone[0] is not None
