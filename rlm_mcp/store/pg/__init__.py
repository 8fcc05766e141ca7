"""Team mode's store: shared state on PostgreSQL (docs/team.md).

`RLM_MCP_DATABASE_URL=postgresql://...` selects it (`settings.deployment`; `rlm_mcp.store.factory`). Contexts (their
bytes chunked in the database, or objects in the bucket of `RLM_MCP_BLOB_URL` with the index
here; cached per replica), uploads, run records and events, and the viewer's spent login codes
live in one database every replica shares; each replica keeps only its cache and temp files in
its data dir. The run queue's state (`queue.py`, `workers.py`, every statement in
`queue_statements.py`) is built by the assembly for team roles, not by `make_pg_stores`; every
advisory-lock key is in `locks.py`.
Needs the `team` extra (psycopg 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlm_mcp.config import BlobSettings, StoreSettings, TeamDatabase
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.pg.bucket_blobs import BucketBlobs
from rlm_mcp.store.pg.contexts import PgContextStore
from rlm_mcp.store.pg.db import Database, DatabaseUnavailableError, SchemaError
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.store.pg.spent_codes import PgSpentCodes
from rlm_mcp.store.pg.uploads import PgUploadStore
from rlm_mcp.store.pg.webhooks import PgWebhookOutbox

__all__ = [
    "Database",
    "DatabaseUnavailableError",
    "PgStores",
    "SchemaError",
    "bucket_blobs",
    "bucket_of",
    "make_pg_stores",
]


@dataclass
class PgStores(Stores):
    """The bundle on PostgreSQL, with what team mode's own parts (the run queue, the sessions)
    build on typed: the team assembly takes this, never a bundle it would have to check.
    `bucket`: where contexts' and snapshots' bytes go when RLM_MCP_BLOB_URL is set (None: rows)."""

    team: TeamDatabase = field(kw_only=True)
    db: Database = field(kw_only=True)
    run_rows: PgRunStore = field(kw_only=True)
    bucket: BucketBlobs | None = field(default=None, kw_only=True)


def make_pg_stores(
    store: StoreSettings, team: TeamDatabase, *, replica: bool, blobs: BlobSettings | None = None, warm: int = 1
) -> PgStores:
    """The stores on the database `team` names; `store`: their caps and this replica's data dir;
    `blobs`: where the bytes go (rows, or the bucket of RLM_MCP_BLOB_URL); `warm`: the pool's
    connections kept open from the start (a worker: one per run slot, since each running run
    writes its log on its own; psycopg's pool otherwise grows one connection at a time, only once
    a statement already waits, and shrinks back after ten idle minutes, so each burst of runs
    paid a handshake per connection while its first turns waited)."""
    db = Database(team.dsn, replica=replica, min_size=warm)
    port = bucket_blobs(db, blobs) if blobs is not None else None
    contexts = PgContextStore(store, db, port, blobs.cache_max_bytes if blobs is not None else None)
    if replica:
        db.on_heartbeat.append(lambda: contexts.cache.sweep(db))
        if port is not None:
            db.on_heartbeat.append(port.maybe_sweep)
    runs = PgRunStore(db)
    return PgStores(
        contexts=contexts,
        uploads=PgUploadStore(store, contexts, db),
        runs=runs,
        kind="postgresql",
        lifecycle=db,
        spent_codes=PgSpentCodes(db),
        webhooks=PgWebhookOutbox(db),
        blob_fault=port.bucket.fault if port is not None else None,
        team=team,
        db=db,
        run_rows=runs,
        bucket=port,
    )


def bucket_blobs(db: Database, blobs: BlobSettings) -> BucketBlobs | None:
    """The bucket of RLM_MCP_BLOB_URL on `db`'s index; None when it is unset (the rows)."""
    from rlm_mcp.store.bucket import Bucket

    location = blobs.location
    if location is None:
        return None
    return BucketBlobs(db, Bucket(location, timeout_s=blobs.blob_timeout_s), blobs)


def bucket_of(stores: Stores) -> BucketBlobs | None:
    """The bucket team-mode `stores` keep bytes in (sessions' snapshots go there too); None: rows."""
    return stores.bucket if isinstance(stores, PgStores) else None
