"""Every statement on team-mode worker state (`rlm_workers`), on PostgreSQL: the worker half of
`port.RunQueuePort` (`state.PgRunQueue` adds the run statements).

A worker registers with its run slots, renews its lease with a heartbeat set by the database's
`now()` (which also returns the runs the database says it holds, so it stops those it no longer
does), and is gone when it says so or its heartbeat is older than RLM_MCP_WORKER_LEASE_S. Every
lease is judged on the database's clock; this process's clock is compared with it only to warn
of a skew (`clock_skew_s`). Workers gone or silent for a day, with no run left, are forgotten.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable

from rlm_mcp.config import Settings
from rlm_mcp.ports.runs import WorkerRef
from rlm_mcp.service.queue.port import Beat, LostWorker
from rlm_mcp.service.queue.sql import NOW, QUEUE_CHANNEL
from rlm_mcp.store.pg.db import Conn, Database

FORGET_AFTER_S = 86400.0


class PgWorkerRegistry:
    """The workers of the team database: registration, heartbeats, leases."""

    def __init__(self, settings: Settings, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        """`clock`: this process's clock, compared with the database's only to warn of a skew."""
        self._clock = clock
        self._settings = settings
        self._db = db
        self._lease = settings.worker_lease_s

    async def live_workers(self) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM rlm_workers WHERE gone_at IS NULL "
                "AND heartbeat_at > now() - make_interval(secs => %s)",
                (self._lease,),
            )
            row = await cur.fetchone()
        return int(row["n"]) if row else 0

    async def register_worker(self, owner_id: str, slots: int) -> int:
        async with self._db.transaction() as conn:
            # This owner's earlier registrations (declared lost during an outage) are over: their
            # sandboxes are this process's own and must not be reaped as a lost worker's.
            await conn.execute(
                f"UPDATE rlm_workers SET gone_at = {NOW} WHERE owner_id = %s AND gone_at IS NULL", (owner_id,)
            )
            cur = await conn.execute(
                "INSERT INTO rlm_workers (owner_id, host, pid, started_at, heartbeat_at, slots) "
                f"VALUES (%s, %s, %s, {NOW}, now(), %s) RETURNING worker_id",
                (owner_id, socket.gethostname(), os.getpid(), slots),
            )
            row = await cur.fetchone()
            assert row is not None
            await conn.execute("SELECT pg_notify(%s, 'queued')", (QUEUE_CHANNEL,))  # more slots: look again
        return int(row["worker_id"])

    async def unregister_worker(self, worker_id: int) -> None:
        await self.mark_gone(worker_id)

    async def heartbeat(self, worker_id: int) -> Beat:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "WITH beat AS (UPDATE rlm_workers SET heartbeat_at = now() WHERE worker_id = %s AND gone_at IS NULL "
                "RETURNING worker_id) SELECT EXISTS (SELECT 1 FROM beat) AS registered, "
                "(SELECT coalesce(json_agg(json_build_array(run_id, attempt, cancel_requested)), '[]'::json) "
                " FROM rlm_runs WHERE state = 'running' AND worker_id = %s) AS held",
                (worker_id, worker_id),
            )
            row = await cur.fetchone()
        assert row is not None
        held = row["held"] if not isinstance(row["held"], str) else json.loads(row["held"])
        return Beat(bool(row["registered"]), {str(r[0]): (int(r[1]), bool(r[2])) for r in held})

    async def worker_ref(self, worker_id: int | None) -> WorkerRef:
        """A worker as notices name it: its id, host and pid (its id alone when its row is gone)."""
        async with self._db.connection() as conn:
            return await self._worker_ref(conn, worker_id)

    async def _worker_ref(self, conn: Conn, worker_id: int | None) -> WorkerRef:
        if worker_id is None:
            return WorkerRef()
        cur = await conn.execute("SELECT host, pid FROM rlm_workers WHERE worker_id = %s", (worker_id,))
        row = await cur.fetchone()
        if row is None:
            return WorkerRef(worker_id=worker_id)
        return WorkerRef(worker_id=worker_id, host=row["host"], pid=row["pid"])

    async def sweep_plan(self) -> tuple[float | None, float]:
        """(seconds until the oldest live worker's lease ends, or None; seconds since the
        database started, by its own clock)."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT (SELECT extract(epoch FROM min(heartbeat_at) - now()) FROM rlm_workers WHERE gone_at IS NULL "
                " AND heartbeat_at > now() - make_interval(secs => %s)) AS oldest_s, "
                "extract(epoch FROM now() - pg_postmaster_start_time()) AS up_s",
                (self._lease,),
            )
            row = await cur.fetchone()
        assert row is not None
        oldest = None if row["oldest_s"] is None else float(row["oldest_s"])
        return oldest, float(row["up_s"])

    async def forget_old_workers(self) -> None:
        """Keep `rlm_workers` small: workers gone or silent for a day, with no run left."""
        async with self._db.connection() as conn:
            await conn.execute(
                f"DELETE FROM rlm_workers w WHERE (w.gone_at < {NOW} - %s OR w.heartbeat_at < now() - "
                "make_interval(secs => %s)) AND NOT EXISTS (SELECT 1 FROM rlm_runs r WHERE r.state = 'running' "
                "AND r.worker_id = w.worker_id)",
                (FORGET_AFTER_S, FORGET_AFTER_S),
            )

    async def workers(self) -> tuple[list[LostWorker], set[str]]:
        """The registered workers past their lease, and the owner ids of those within it."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT worker_id, owner_id, host, heartbeat_at > now() - make_interval(secs => %s) AS live "
                "FROM rlm_workers WHERE gone_at IS NULL",
                (self._lease,),
            )
            rows = await cur.fetchall()
        live = {r["owner_id"] for r in rows if r["live"]}
        lost = [LostWorker(r["worker_id"], r["owner_id"], r["host"]) for r in rows if r["owner_id"] not in live]
        return lost, live

    async def mark_gone(self, worker_id: int) -> None:
        async with self._db.connection() as conn:
            await conn.execute(f"UPDATE rlm_workers SET gone_at = {NOW} WHERE worker_id = %s", (worker_id,))

    async def clock_skew_s(self) -> float:
        """This process's clock minus the database's (seconds), halfway through the round trip."""
        async with self._db.connection() as conn:
            before = self._clock()
            cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp()) AS t")
            row = await cur.fetchone()
            after = self._clock()
        assert row is not None
        return (before + after) / 2 - float(row["t"])
