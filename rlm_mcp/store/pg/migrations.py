"""Team mode's schema migrations (`rlm_mcp/store/migrations/postgres/`), applied at start.

Several processes starting together take `pg_advisory_lock` on one key, so the first applies
what is missing and the others find the schema current. The applied versions are rows of
`rlm_schema`; each migration runs in a transaction with the row that records it. A database
whose schema is newer than the newest migration here belongs to a newer rlm-mcp: this process
refuses it (one line naming both versions) rather than writing rows the newer code does not expect.
"""

from __future__ import annotations

from typing import Any

import psycopg

from rlm_mcp.store.migrations import MigrationError, SchemaError, latest, pending, step_refused
from rlm_mcp.store.pg.locks import MIGRATION_LOCK_KEY

LATEST = latest("postgres")

_NEWER_FIX = "Upgrade rlm-mcp on this replica to the version the other replicas run."


async def schema_version(conn: Any) -> int:
    """The schema version in place (0: none yet)."""
    cur = await conn.execute("SELECT to_regclass('rlm_schema') IS NOT NULL")
    row = await cur.fetchone()
    if not (row and list(row.values() if isinstance(row, dict) else row)[0]):
        return 0
    cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM rlm_schema")
    row = await cur.fetchone()
    return int(list(row.values() if isinstance(row, dict) else row)[0]) if row else 0


async def migrate(
    conn: psycopg.AsyncConnection[Any], *, target: int | None = None, where: str = "database of RLM_MCP_DATABASE_URL"
) -> int:
    """Bring the schema to LATEST (or to `target`, for tests of a former release's database) on an
    autocommit connection; returns the version now in place. A step the database refuses for
    what the schema holds is a `MigrationError` (`where` names the database), not an outage."""
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS rlm_schema (version integer NOT NULL, applied_at timestamptz)")
        cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM rlm_schema")
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
        for step in pending("postgres", current, where="database schema", fix=_NEWER_FIX, target=target):
            try:
                async with conn.transaction():
                    if step.sql is not None:
                        await conn.execute(step.sql.encode())  # trusted DDL, ours; bytes: no placeholders
                    elif step.function is not None:
                        await step.function(conn)
                    await conn.execute("INSERT INTO rlm_schema VALUES (%s, now())", (step.version,))
            except psycopg.Error as exc:
                # The connection failing, or a role without CREATE (the caller phrases those).
                if isinstance(exc, psycopg.OperationalError) or exc.sqlstate == "42501":
                    raise
                raise step_refused("postgres", step, current, where, _detail(exc)) from None
            current = step.version
        return current
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


async def rehearse(conn: psycopg.AsyncConnection[Any], *, where: str) -> MigrationError | None:
    """The refusal the pending steps would meet (None: they apply, or none is pending), for
    `doctor`: tried in one transaction that is always rolled back, so nothing changes. A lock it
    would wait for (a busy table) or a missing privilege is not a refusal (doctor says those)."""
    cur = await conn.execute("SELECT to_regclass('rlm_schema') IS NOT NULL")
    row = await cur.fetchone()
    current = 0
    if row and row[0]:
        cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM rlm_schema")
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
    steps = pending("postgres", current, where="database schema", fix=_NEWER_FIX)
    if not steps:
        return None
    async with conn.transaction(force_rollback=True):
        await conn.execute("SET LOCAL lock_timeout = '2s'")
        for step in steps:
            try:
                async with conn.transaction():  # a savepoint: the refusal is read, then rolled back
                    if step.sql is not None:
                        await conn.execute(step.sql.encode())
                    elif step.function is not None:
                        await step.function(conn)
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError) or exc.sqlstate in ("42501", "55P03"):
                    return None
                return step_refused("postgres", step, current, where, _detail(exc))
    return None


def _detail(exc: psycopg.Error) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"SQLSTATE {exc.sqlstate}: {first}"


__all__ = ["LATEST", "SchemaError", "migrate", "rehearse", "schema_version"]
