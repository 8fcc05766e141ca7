"""Contexts in PostgreSQL (team mode): the index beneath `store.contexts`' rules, shared by every
replica.

The bytes are kept by a `store.ports.BlobPort`: rows of `rlm_blob_chunks` (1 MiB each, `blobs`,
the default) or objects in a bucket (`bucket_blobs`, RLM_MCP_BLOB_URL), written from a local
temp file piece by piece and read back the same way into this replica's cache
(`cache.BlobCache`), so no step holds a whole context in memory. `rlm_blobs` indexes each
content either way. Each owner holding a content has its own copy: deduplication is within an
owner only, so a load's cost never tells one token that another stored the same bytes. A pin is live while its replica's
heartbeat is recent; pins and heartbeats are stamped and judged by the database's clock
(replicas' own clocks may differ), and so is every time the rules write or compare: a write
transaction's `now` is the database's, read with its BEGIN (`Database.clocked_transaction`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import StoreSettings
from rlm_mcp.owners import Owner
from rlm_mcp.store._ingest import CHUNK, Ingested
from rlm_mcp.store.context_model import PIN_TTL_S, ContextInfo, context_info, well_formed_id
from rlm_mcp.store.contexts import Contexts, unknown_context
from rlm_mcp.store.index import Row
from rlm_mcp.store.pg.blobs import RowBlobs
from rlm_mcp.store.pg.cache import BlobCache
from rlm_mcp.store.pg.db import REPLICA_TTL_S, Conn, Database
from rlm_mcp.store.pg.locks import EVICT_LOCK_KEY, OWNER_LOCK_CLASS
from rlm_mcp.store.pg.pin_statements import PIN_RULE
from rlm_mcp.store.pg.reads import NOW, read_now
from rlm_mcp.store.ports import BlobPort
from rlm_mcp.store.statements import POSTGRES

__all__ = ["EVICT_LOCK_KEY", "OWNER_LOCK_CLASS", "PgContextIndex", "PgContextStore", "PgTx"]


_LAPSED_PINS = (
    "DELETE FROM rlm_pins p WHERE p.expires_at < extract(epoch FROM now()) OR NOT EXISTS "
    "(SELECT 1 FROM rlm_replicas r WHERE r.replica_id = p.replica_id AND r.seen_at > extract(epoch FROM now()) - %s)"
)
_ADD_PIN = "INSERT INTO rlm_pins VALUES (%s, %s, %s, %s, extract(epoch FROM now()) + %s)"
# A run's pins in one statement (`PgContextStore._pin`): the owner's rows of the ids, each marked
# used (the context's and the owner's `last_used_at`) and pinned, all or none: the writes apply
# only when every distinct id was found (else the caller raises, as the shared rule's rollback
# leaves nothing behind). One round trip where the shared rule's transaction took seven (BEGIN,
# the clock, the row, two touches, the pin, COMMIT), and the context's row lock is held for the
# statement only: every run of a team touches the same row of a shared context. The rule's SQL is
# `pin_statements.PIN_RULE`, which a team worker's claim also pins its runs' contexts by
# (`queue_statements.CLAIM`); here one holder: the ids (`%(n)s` distinct ones asked for, a
# malformed id among them never found) under one pin id. Every row found is returned, so the
# caller names the first id missing.
_PIN = (
    "WITH want AS (SELECT %(pin)s::text AS pin_id, %(owner)s::text AS owner, u.cid "
    "  FROM unnest(%(ids)s::text[]) AS u (cid)), "
    "holders AS (SELECT %(pin)s::text AS pin_id, %(n)s::bigint AS expected), "
    f"{PIN_RULE} "
    "SELECT f.*, t.now AS last_used_at, t.now FROM found f, t"
)
_REMOVE_PIN = "DELETE FROM rlm_pins WHERE pin_id = %s"


class PgTx:
    """Statements on one pooled connection inside a transaction; `now`: the database's clock at
    its start (None for the one-statement transactions of a read: asked for when needed)."""

    def __init__(self, conn: Conn, now: float | None = None) -> None:
        self.conn = conn
        self._now = now

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        cur = await self.conn.execute(sql, params)
        return await cur.fetchone()

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self.conn.execute(sql, params)
        rows: list[Row] = await cur.fetchall()
        return rows

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self.conn.execute(sql, params)

    async def now(self) -> float:
        if self._now is None:  # a read: one more statement (a write's came with its BEGIN)
            self._now = await read_now(await self.conn.execute(NOW))
        return self._now

    async def lock_owner(self, owner: Owner) -> None:
        await self.conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (OWNER_LOCK_CLASS, owner))


class PgContextTx(PgTx):
    def __init__(self, conn: Conn, replica_id: str, blobs: BlobPort, now: float | None = None) -> None:
        super().__init__(conn, now)
        self._replica_id = replica_id
        self._blobs = blobs
        self.gone: list[str] = []  # blobs removed: dropped from this replica's cache after the commit
        self.doomed: list[str] = []  # objects no row refers to any more: removed after the commit

    async def lock_context(self, context_id: str) -> None:
        await self.conn.execute("SELECT 1 FROM rlm_contexts WHERE context_id = %s FOR UPDATE", (context_id,))

    async def lock_eviction(self) -> None:
        await self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (EVICT_LOCK_KEY,))

    async def live_pins(self, now: float) -> set[tuple[str, str | None]]:
        await self.conn.execute(_LAPSED_PINS, (REPLICA_TTL_S,))
        return {(r["context_id"], r["owner"]) for r in await self.all("SELECT context_id, owner FROM rlm_pins")}

    async def add_pins(self, pin_id: str, context_ids: Sequence[str], owner: Owner, now: float) -> None:
        for cid in context_ids:
            await self.conn.execute(_ADD_PIN, (pin_id, cid, self._replica_id, owner, PIN_TTL_S))

    async def put_blob(self, ing: Ingested, owner: Owner) -> None:
        # `chunks` counts the content's rows; 0: its bytes are in the bucket.
        chunks = -(-ing.bytes // CHUNK) if isinstance(self._blobs, RowBlobs) else 0
        new = await self.one(
            "INSERT INTO rlm_blobs VALUES (%s, %s, %s, extract(epoch FROM now())) "
            "ON CONFLICT (sha256) DO NOTHING RETURNING sha256",
            (ing.sha256, ing.bytes, chunks),
        )
        await self._blobs.put(self.conn, ing, owner, new=new is not None)

    async def release_blob(self, sha256: str) -> None:
        gone, doomed = await self._blobs.release(self.conn, sha256)  # else the copies beyond one per holder go
        if gone:
            self.gone.append(sha256)
        self.doomed += doomed

    async def blob_intact(self, row: Row) -> bool:
        return True  # `make_local` fetches the bytes, checked against their digest


class PgContextIndex:
    sql = POSTGRES

    def __init__(
        self, data_dir: Path, db: Database, blobs: BlobPort | None = None, cache_max_bytes: int | None = None
    ) -> None:
        self._db = db
        self.blobs: BlobPort = blobs if blobs is not None else RowBlobs(db)
        self.tmp_dir = data_dir / "tmp"
        self.cache = BlobCache(data_dir / "cache", self.tmp_dir, cache_max_bytes)
        self.clock: Callable[[], float] = time.time  # this host's: its temp files' ages only

    def prepare(self) -> None:
        self.cache.prepare()

    def local_path(self, sha256: str) -> Path:
        return self.cache.path(sha256)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[PgContextTx]:
        async with self._db.connection() as conn:  # autocommit: one statement each
            yield PgContextTx(conn, self._db.replica_id, self.blobs)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[PgContextTx]:
        async with self._db.clocked_transaction() as (conn, now):
            tx = PgContextTx(conn, self._db.replica_id, self.blobs, now)
            yield tx
        if tx.gone:
            await anyio.to_thread.run_sync(self.cache.drop, tx.gone)
        if tx.doomed:
            with anyio.CancelScope(shield=True):  # committed: the objects go now, else at the next sweep
                await self.blobs.purge(tx.doomed)

    async def present(self) -> bool:
        return True

    async def adopt(self, ing: Ingested) -> None:
        await anyio.to_thread.run_sync(self.cache.adopt, ing.tmp_path, ing.sha256)

    async def make_local(self, infos: Sequence[ContextInfo]) -> None:
        for info in infos:
            await self.cache.fetch(self.blobs, info.sha256, info.bytes)


class PgContextStore(Contexts):
    """Stored contexts in PostgreSQL, cached per replica under `data_dir/cache`."""

    def __init__(
        self, settings: StoreSettings, db: Database, blobs: BlobPort | None = None, cache_max_bytes: int | None = None
    ) -> None:
        self.rows = PgContextIndex(Path(settings.data_dir), db, blobs, cache_max_bytes)
        super().__init__(settings, self.rows)
        self.cache = self.rows.cache
        self._db = db

    async def _pin(self, context_ids: list[str], pin_id: str, owner: Owner) -> list[ContextInfo]:
        """The shared rule (`Contexts._pin`: resolve, mark used, pin, all or none) in one
        statement (`_PIN`); NotFoundError naming the first id the owner does not hold."""
        params = {
            "ids": [cid for cid in dict.fromkeys(context_ids) if well_formed_id(cid)],
            "owner": str(owner),
            "n": len(set(context_ids)),  # a malformed id is never found: then nothing is written
            "pin": pin_id,
            "replica": self._db.replica_id,
            "ttl": PIN_TTL_S,
        }
        async with self._db.connection() as conn:
            cur = await conn.execute(_PIN, params)
            rows = {r["context_id"]: r for r in await cur.fetchall()}
        infos = []
        for cid in context_ids:
            row = rows.get(cid)
            if row is None:
                raise unknown_context(cid)  # nothing was written: the statement's writes need every id
            infos.append(context_info(row).model_copy(update={"last_used_at": row["now"]}))
        return infos

    async def _unpin(self, pin_id: str) -> None:
        """One autocommit statement (the shared rule's write transaction took four round trips)."""
        async with self._db.connection() as conn:
            await conn.execute(_REMOVE_PIN, (pin_id,))
