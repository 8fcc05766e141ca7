"""What `rlm-mcp doctor` reports in team mode: the database, its schema, the replicas seen, the
run queue's live workers (host, pid, heartbeat age, runs) and its depth, and how far this host's
clock is from the database's (every time replicas compare is the database's; a host whose own
clock is off shows misleading times and says so). Reads tables only."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from rlm_mcp.store.pg.connect import Connection
from rlm_mcp.store.pg.db import CONNECT_TIMEOUT_S, REPLICA_TTL_S, Database, describe
from rlm_mcp.store.pg.migrations import LATEST


@dataclass
class TeamStatus:
    where: str
    error: str | None = None  # why the database is unreachable (no password in it)
    fix: str = ""
    schema_version: int = 0
    replicas: list[str] = field(default_factory=list)  # "host pid version, seen N s ago"
    workers: list[str] | None = None  # "worker N on host pid P, heartbeat N s ago, R runs"; None: no queue yet
    queued: int = 0  # runs waiting for a worker
    clock_skew_s: float | None = None  # this host's clock minus the database's


# Migration 6: runs and workers hold their own state (`rlm_runs.state`, `rlm_workers.heartbeat_at`).
_QUEUE_SCHEMA = 6


async def team_status(url: str, worker_lease_s: float, *, clock: Callable[[], float] = time.time) -> TeamStatus:
    """Connects once, changes nothing (no migration, no replica row). A worker silent longer
    than `worker_lease_s` (RLM_MCP_WORKER_LEASE_S, the lease the servers' sweepers apply) is
    not listed as live."""
    status = TeamStatus(where=describe(url))
    probe = Database(url, replica=False)
    try:
        async with await Connection.connect(
            url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S), row_factory=dict_row
        ) as conn:
            before = clock()
            cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp()) AS t")
            row = await cur.fetchone()
            status.clock_skew_s = (before + clock()) / 2 - float(row["t"]) if row else None
            cur = await conn.execute("SELECT to_regclass('rlm_schema') IS NOT NULL AS present")
            row = await cur.fetchone()
            if row and row["present"]:
                cur = await conn.execute("SELECT COALESCE(MAX(version), 0) AS v FROM rlm_schema")
                row = await cur.fetchone()
                status.schema_version = int(row["v"]) if row else 0
            if status.schema_version:
                cur = await conn.execute(
                    "SELECT host, pid, version, extract(epoch FROM now()) - seen_at AS age FROM rlm_replicas "
                    "WHERE seen_at > extract(epoch FROM now()) - %s ORDER BY seen_at DESC",
                    (REPLICA_TTL_S,),
                )
                status.replicas = [
                    f"{r['host']} pid {r['pid']} (rlm-mcp {r['version']}, seen {float(r['age']):.0f} s ago)"
                    for r in await cur.fetchall()
                ]
                if status.schema_version >= _QUEUE_SCHEMA:
                    await _queue(conn, status, worker_lease_s)
    except psycopg.OperationalError as exc:
        err = probe.unavailable(exc)
        status.error, status.fix = err.cause, err.fix or ""
    return status


async def _queue(conn: psycopg.AsyncConnection[dict[str, Any]], status: TeamStatus, lease_s: float) -> None:
    cur = await conn.execute(
        "SELECT w.worker_id AS id, w.host, w.pid, EXTRACT(EPOCH FROM now() - w.heartbeat_at) AS age, "
        "(SELECT count(*) FROM rlm_runs r WHERE r.worker_id = w.worker_id AND r.state = 'running') AS runs "
        "FROM rlm_workers w WHERE w.gone_at IS NULL AND w.heartbeat_at > now() - make_interval(secs => %s) "
        "ORDER BY w.worker_id",
        (lease_s,),
    )
    status.workers = [
        f"worker {r['id']} on {r['host'] or '?'} pid {r['pid'] or '?'} "
        f"(heartbeat {float(r['age']):.0f} s ago, {r['runs']} run{'s' if r['runs'] != 1 else ''})"
        for r in await cur.fetchall()
    ]
    cur = await conn.execute("SELECT count(*) AS n FROM rlm_runs WHERE state = 'queued'")
    row = await cur.fetchone()
    status.queued = int(row["n"]) if row else 0


__all__ = ["LATEST", "TeamStatus", "team_status"]
