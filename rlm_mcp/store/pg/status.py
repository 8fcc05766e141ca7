"""What `rlm-mcp doctor` reports in team mode: the database, its schema, the replicas seen."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psycopg
from psycopg.rows import dict_row

from rlm_mcp.store.pg.db import CONNECT_TIMEOUT_S, REPLICA_TTL_S, Database, describe
from rlm_mcp.store.pg.migrations import LATEST


@dataclass
class TeamStatus:
    where: str
    error: str | None = None  # why the database is unreachable (no password in it)
    fix: str = ""
    schema_version: int = 0
    replicas: list[str] = field(default_factory=list)  # "host pid version, seen N s ago"


async def team_status(url: str) -> TeamStatus:
    """Connects once, changes nothing (no migration, no replica row)."""
    status = TeamStatus(where=describe(url))
    probe = Database(url, replica=False)
    try:
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S), row_factory=dict_row
        ) as conn:
            cur = await conn.execute("SELECT to_regclass('rlm_schema') IS NOT NULL AS present")
            row = await cur.fetchone()
            if row and row["present"]:
                cur = await conn.execute("SELECT COALESCE(MAX(version), 0) AS v FROM rlm_schema")
                row = await cur.fetchone()
                status.schema_version = int(row["v"]) if row else 0
            if status.schema_version:
                now = time.time()
                cur = await conn.execute(
                    "SELECT host, pid, version, seen_at FROM rlm_replicas WHERE seen_at > %s ORDER BY seen_at DESC",
                    (now - REPLICA_TTL_S,),
                )
                status.replicas = [
                    f"{r['host']} pid {r['pid']} (rlm-mcp {r['version']}, seen {now - r['seen_at']:.0f} s ago)"
                    for r in await cur.fetchall()
                ]
    except psycopg.OperationalError as exc:
        err = probe.unavailable(exc)
        status.error, status.fix = err.cause, err.fix or ""
    return status


__all__ = ["LATEST", "TeamStatus", "team_status"]
