"""Versioned schema migrations, applied at start under an advisory lock.

Several processes starting together take `pg_advisory_lock` on one key, so the first applies
what is missing and the others find the schema current. A database whose schema is newer than
the newest migration here belongs to a newer rlm-mcp: this process refuses it (one line naming
both versions) rather than writing rows the newer code does not expect.

Tables are prefixed `rlm_`, so rlm-mcp can share a database with other applications. Times are
Unix seconds (float), as in the SQLite index. Run records are keyed by run id and their events
ordered by a per-run sequence, which a run queue with workers and leases can build on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.store.pg.migration_run_state import RUN_STATE_SQL
from rlm_mcp.store.pg.migration_sessions import SESSIONS_SQL

ADVISORY_LOCK_KEY = 0x726C6D2D6D6370  # "rlm-mcp"


# Migration 3 applied the schema of Procrastinate, the job queue team mode used before it
# claimed runs on `rlm_runs` itself (migration 6, which removes those tables). A new database
# skips it: nothing of it is used any more.
_FORMER_QUEUE_LIBRARY = "SELECT 1"


# The run queue's own columns and tables (rlm_mcp.service.queue): which Procrastinate job carries
# a run, which worker runs it, whether it called the LM (a lost run that had not may start again,
# once), and the workers' names (host, pid, sandbox owner label) for statuses and clean-up.
_QUEUE_SQL = """
ALTER TABLE rlm_runs
    ADD COLUMN job_id    bigint,
    ADD COLUMN worker_id bigint,
    ADD COLUMN lm_called boolean NOT NULL DEFAULT false,
    ADD COLUMN requeues  integer NOT NULL DEFAULT 0;
CREATE INDEX rlm_runs_job ON rlm_runs (job_id);
CREATE TABLE rlm_workers (
    worker_id   bigint PRIMARY KEY,
    owner_id    text NOT NULL,
    host        text NOT NULL,
    pid         integer NOT NULL,
    started_at  double precision NOT NULL,
    gone_at     double precision
);
"""

MIGRATIONS: list[tuple[int, str | Callable[[], str]]] = [
    (
        1,
        """
        CREATE TABLE rlm_blobs (
            sha256      text PRIMARY KEY,
            bytes       bigint NOT NULL,
            chunks      integer NOT NULL,
            created_at  double precision NOT NULL
        );
        CREATE TABLE rlm_blob_chunks (
            sha256  text NOT NULL REFERENCES rlm_blobs (sha256) ON DELETE CASCADE,
            idx     integer NOT NULL,
            data    bytea NOT NULL,
            PRIMARY KEY (sha256, idx)
        );
        -- Stored as is, not compressed: pglz costs more CPU than the disk it saves on text.
        ALTER TABLE rlm_blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
        CREATE TABLE rlm_contexts (
            context_id   text PRIMARY KEY,
            sha256       text NOT NULL REFERENCES rlm_blobs (sha256),
            name         text NOT NULL,
            bytes        bigint NOT NULL,
            format       text NOT NULL,
            kind         text NOT NULL,
            chars        bigint NOT NULL,
            created_at   double precision NOT NULL,
            last_used_at double precision NOT NULL,
            source       text NOT NULL
        );
        CREATE INDEX rlm_contexts_sha ON rlm_contexts (sha256);
        CREATE INDEX rlm_contexts_lru ON rlm_contexts (last_used_at);
        CREATE TABLE rlm_context_owners (
            context_id   text NOT NULL REFERENCES rlm_contexts (context_id) ON DELETE CASCADE,
            owner        text NOT NULL,
            name         text NOT NULL,
            source       text NOT NULL,
            created_at   double precision NOT NULL,
            last_used_at double precision NOT NULL,
            PRIMARY KEY (context_id, owner)
        );
        CREATE INDEX rlm_context_owners_owner ON rlm_context_owners (owner, last_used_at);
        CREATE TABLE rlm_replicas (
            replica_id  text PRIMARY KEY,
            host        text NOT NULL,
            pid         integer NOT NULL,
            version     text NOT NULL,
            started_at  double precision NOT NULL,
            seen_at     double precision NOT NULL
        );
        CREATE TABLE rlm_pins (
            pin_id      text NOT NULL,
            context_id  text NOT NULL,
            replica_id  text NOT NULL,
            owner       text NOT NULL,
            expires_at  double precision NOT NULL
        );
        CREATE INDEX rlm_pins_ctx ON rlm_pins (context_id);
        CREATE TABLE rlm_uploads (
            upload_id      text PRIMARY KEY,
            next_index     integer NOT NULL,
            bytes_received bigint NOT NULL,
            last_chunk_sha text,
            name           text,
            format         text,
            created_at     double precision NOT NULL,
            updated_at     double precision NOT NULL,
            done           boolean NOT NULL DEFAULT false,
            finalizing     boolean NOT NULL DEFAULT false,
            context_id     text
        );
        CREATE TABLE rlm_upload_chunks (
            upload_id  text NOT NULL REFERENCES rlm_uploads (upload_id) ON DELETE CASCADE,
            idx        integer NOT NULL,
            data       bytea NOT NULL,
            PRIMARY KEY (upload_id, idx)
        );
        CREATE TABLE rlm_runs (
            run_id      text PRIMARY KEY,
            owner       text NOT NULL,
            created_at  double precision NOT NULL,
            updated_at  double precision NOT NULL,
            done        boolean NOT NULL DEFAULT false,
            summary     text NOT NULL,
            log_bytes   bigint NOT NULL DEFAULT 0,
            next_seq    bigint NOT NULL DEFAULT 0
        );
        CREATE INDEX rlm_runs_owner ON rlm_runs (owner, created_at);
        CREATE INDEX rlm_runs_created ON rlm_runs (created_at);
        CREATE TABLE rlm_run_events (
            run_id  text NOT NULL REFERENCES rlm_runs (run_id) ON DELETE CASCADE,
            seq     bigint NOT NULL,
            line    text NOT NULL,
            PRIMARY KEY (run_id, seq)
        );
        CREATE TABLE rlm_secrets (
            name   text PRIMARY KEY,
            value  bytea NOT NULL
        );
        """,
    ),
    (
        2,
        """
        -- Uploads record the owner that started them: only it may continue one, and each
        -- owner's unfinished bytes count against its own share (rlm_mcp.store.owner_caps).
        -- Rows from before have none and expire within a day.
        ALTER TABLE rlm_uploads ADD COLUMN owner text;
        CREATE INDEX rlm_uploads_owner ON rlm_uploads (owner) WHERE NOT done;
        """,
    ),
    (3, _FORMER_QUEUE_LIBRARY),
    (4, _QUEUE_SQL),
    (
        5,
        """
        -- The viewer's one-time login codes, spent once on any replica (rlm_mcp.store.pg.spent_codes):
        -- a hash of each spent code until a while after it expired.
        CREATE TABLE rlm_spent_codes (
            code_sha256  text PRIMARY KEY,
            expires_at   double precision NOT NULL
        );
        CREATE INDEX rlm_spent_codes_expiry ON rlm_spent_codes (expires_at);
        """,
    ),
    (6, RUN_STATE_SQL),
    (7, SESSIONS_SQL),
]

LATEST = MIGRATIONS[-1][0]


class SchemaError(RlmMcpError):
    """The database's schema is newer than this version of rlm-mcp knows."""


async def migrate(conn: psycopg.AsyncConnection[Any]) -> int:
    """Bring the schema to LATEST (autocommit connection); returns the version now in place."""
    await conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_KEY,))
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS rlm_schema (version integer NOT NULL, applied_at timestamptz)")
        cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM rlm_schema")
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
        if current > LATEST:
            raise SchemaError(
                f"The database schema is version {current}, newer than this rlm-mcp knows (version {LATEST}).",
                "Upgrade rlm-mcp on this replica to the version the other replicas run.",
            )
        for version, sql in MIGRATIONS:
            if version <= current:
                continue
            async with conn.transaction():
                text = sql() if callable(sql) else sql
                await conn.execute(text.encode())  # trusted DDL, ours
                await conn.execute("INSERT INTO rlm_schema VALUES (%s, now())", (version,))
            current = version
        return current
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))
