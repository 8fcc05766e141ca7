"""Sweepers against a real PostgreSQL (tests/postgres): a clock the test moves, a worker made
silent, sweepers connected for a full lease."""

from __future__ import annotations

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.service.queue.sweeper import Sweeper
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue


class Clock:
    """A monotonic clock the test moves (the sweeper's view of how long it has been connected)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def silence(db: Database, worker: int) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE rlm_workers SET heartbeat_at = now() - interval '1 hour' WHERE worker_id = %s", (worker,)
        )


async def connected_sweepers(
    settings: Settings, queue: PgRunQueue, n: int = 3, *, ends: RunEnds | None = None
) -> list[Sweeper]:
    """Sweepers that have been connected for a full lease (they may judge leases), once the
    database itself has been up that long (the sweepers' rule after a restart)."""
    with anyio.fail_after(settings.team.worker_lease_s + 30):
        while (await queue.sweep_look()).up_s < settings.team.worker_lease_s:
            await anyio.sleep(0.2)
    sweepers = []
    for _ in range(n):
        clock = Clock()
        sweeper = Sweeper(settings.queue, queue, clock=clock, ends=ends)
        await sweeper.sweep_once()
        clock.now += settings.team.worker_lease_s + 1
        sweepers.append(sweeper)
    return sweepers
