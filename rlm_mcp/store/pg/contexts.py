"""Contexts in PostgreSQL (team mode): the same rules as `rlm_mcp.store.contexts`, shared by
every replica.

The bytes are rows of `rlm_blob_chunks` (1 MiB each, one blob per distinct sha256), written
from a local temp file chunk by chunk and read back the same way into this replica's cache
(`cache.BlobCache`), so no step holds a whole context in memory. Ownership, pins and eviction
follow the SQLite store: a delete removes the caller's ownership, the context and blob go when
no owner and no live pin is left; a pin is live while its replica's heartbeat is recent.
"""

from __future__ import annotations

import builtins
import json
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, UnknownIdError, context_too_large
from rlm_mcp.owners import EVERY_OWNER, Owner, OwnerScope
from rlm_mcp.ports import ContextFormat, ContextSpec
from rlm_mcp.store._ingest import CHUNK, Ingested, ingest, read_file_chunks
from rlm_mcp.store.context_model import PIN_TTL_S, ContextInfo, context_id_for, context_info, well_formed_id
from rlm_mcp.store.eviction import plan_eviction
from rlm_mcp.store.owner_caps import releases_in_share, store_share
from rlm_mcp.store.pg.cache import BlobCache
from rlm_mcp.store.pg.db import REPLICA_TTL_S, Conn, Database

log = logging.getLogger("rlm_mcp.store")

EVICT_LOCK_KEY = 0x726C6D2D657663  # one evictor at a time across replicas
OWNER_LOCK_CLASS = 0x726C6D6F  # with hashtext(owner): one owner's share is spent by one writer at a time

_OWNED = (
    "SELECT c.context_id, c.sha256, c.bytes, c.format, c.kind, c.chars, "
    "o.name, o.source, o.created_at, o.last_used_at "
    "FROM rlm_contexts c JOIN rlm_context_owners o ON o.context_id = c.context_id"
)


def _unknown(context_id: str) -> UnknownIdError:
    return UnknownIdError("context", context_id)


async def _select(conn: Conn, context_id: str, owner: OwnerScope) -> dict[str, Any] | None:
    if not well_formed_id(context_id):
        return None
    if owner is EVERY_OWNER:
        cur = await conn.execute("SELECT * FROM rlm_contexts WHERE context_id = %s", (context_id,))
    else:
        cur = await conn.execute(_OWNED + " WHERE c.context_id = %s AND o.owner = %s", (context_id, owner))
    return await cur.fetchone()


async def _live_pins(conn: Conn) -> set[tuple[str, str]]:
    """(context_id, owner) of every live pin; lapsed ones are removed on the way. Pins and replica
    heartbeats are stamped and judged by the database's clock: replicas' own clocks may differ."""
    await conn.execute(
        "DELETE FROM rlm_pins p WHERE p.expires_at < extract(epoch FROM now()) OR NOT EXISTS "
        "(SELECT 1 FROM rlm_replicas r WHERE r.replica_id = p.replica_id AND r.seen_at > extract(epoch FROM now()) - %s)",
        (REPLICA_TTL_S,),
    )
    cur = await conn.execute("SELECT context_id, owner FROM rlm_pins")
    return {(r["context_id"], r["owner"]) for r in await cur.fetchall()}


async def _drop_blob_if_unused(conn: Conn, sha256: str) -> bool:
    cur = await conn.execute(
        "DELETE FROM rlm_blobs b WHERE b.sha256 = %s AND NOT EXISTS "
        "(SELECT 1 FROM rlm_contexts c WHERE c.sha256 = b.sha256) RETURNING sha256",
        (sha256,),
    )
    return await cur.fetchone() is not None


class PgContextStore:
    """Stored contexts in PostgreSQL, cached per replica under `data_dir/cache`."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self._settings = settings
        self._db = db
        root = Path(settings.data_dir)
        self.tmp_dir = root / "tmp"
        self.cache = BlobCache(root / "cache", self.tmp_dir)

    def _prepare(self) -> None:
        self.cache.prepare()

    # --- writing -------------------------------------------------------------------------

    async def put_bytes(
        self, data: bytes, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo:
        if len(data) > self._settings.max_context_bytes:
            raise context_too_large(self._settings.max_context_bytes)
        chunks = (data[i : i + CHUNK] for i in range(0, len(data), CHUNK))
        return await self.put_chunks(chunks, name=name, format=format, source=source, owner=owner)

    async def put_file(
        self,
        path: Path,
        *,
        name: str,
        format: ContextFormat,
        source: dict[str, Any],
        consume: bool = False,
        owner: Owner,
    ) -> ContextInfo:
        path = Path(path)

        def scan() -> Ingested:
            self._prepare()
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise BadArgumentError(f"File '{path}' does not exist.", "Check the path and load it again.") from None
            if size > self._settings.max_context_bytes:
                raise context_too_large(self._settings.max_context_bytes)
            same_fs = consume and path.stat().st_dev == self.tmp_dir.stat().st_dev
            return ingest(
                read_file_chunks(path),
                tmp_dir=self.tmp_dir,
                format=format,
                max_bytes=self._settings.max_context_bytes,
                write=not same_fs,
                existing=path if same_fs else None,
            )

        ing = await anyio.to_thread.run_sync(scan)
        return await self._store(ing, name=name, format=format, source=source, owner=owner)

    async def put_chunks(
        self,
        chunks: Iterable[bytes],
        *,
        name: str,
        format: ContextFormat,
        source: dict[str, Any],
        expected_sha256: str | None = None,
        owner: Owner,
    ) -> ContextInfo:
        def scan() -> Ingested:
            self._prepare()
            return ingest(
                chunks,
                tmp_dir=self.tmp_dir,
                format=format,
                max_bytes=self._settings.max_context_bytes,
                expected_sha256=expected_sha256,
            )

        ing = await anyio.to_thread.run_sync(scan)
        return await self._store(ing, name=name, format=format, source=source, owner=owner)

    async def _store(
        self, ing: Ingested, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo:
        try:
            info = await self._commit(ing, name=name, format=format, source=source, owner=owner)
            await anyio.to_thread.run_sync(self.cache.adopt, ing.tmp_path, ing.sha256)
        finally:
            ing.tmp_path.unlink(missing_ok=True)
        await self.evict(keep=[info.context_id], loader=owner)
        return info

    async def _commit(
        self, ing: Ingested, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo:
        cid = context_id_for(ing.sha256, format)
        now = time.time()
        chunks = -(-ing.bytes // CHUNK)
        gone: list[str] = []
        async with self._db.transaction() as conn:
            gone = await self._make_room_in_share(conn, owner, ing, now)
            cur = await conn.execute(
                "INSERT INTO rlm_blobs VALUES (%s, %s, %s, %s) ON CONFLICT (sha256) DO NOTHING RETURNING sha256",
                (ing.sha256, ing.bytes, chunks, now),
            )
            if (
                await cur.fetchone() is not None
            ):  # new content: stream it in (another writer waits on the key); %b: bytea sent binary, not hex
                fh = await anyio.to_thread.run_sync(open, ing.tmp_path, "rb")
                try:
                    for idx in range(chunks):
                        block = await anyio.to_thread.run_sync(fh.read, CHUNK)
                        await conn.execute("INSERT INTO rlm_blob_chunks VALUES (%s, %s, %b)", (ing.sha256, idx, block))
                finally:
                    await anyio.to_thread.run_sync(fh.close)
            await conn.execute(
                "INSERT INTO rlm_contexts VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (context_id) "
                "DO UPDATE SET name = excluded.name, source = excluded.source, last_used_at = excluded.last_used_at",
                (cid, ing.sha256, name, ing.bytes, format, ing.kind, ing.chars, now, now, json.dumps(source)),
            )
            await conn.execute(
                "INSERT INTO rlm_context_owners VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (context_id, owner) "
                "DO UPDATE SET name = excluded.name, source = excluded.source, last_used_at = excluded.last_used_at",
                (cid, owner, name, json.dumps(source), now, now),
            )
            row = await _select(conn, cid, owner)
            assert row is not None  # written just above, in this transaction
        if gone:
            await anyio.to_thread.run_sync(self.cache.drop, gone)
        log.info("stored context %s (%d bytes, %s) in the database", cid, ing.bytes, format)
        return context_info(row)

    async def _make_room_in_share(self, conn: Conn, owner: Owner, ing: Ingested, now: float) -> list[str]:
        """As the SQLite store's: release `owner`'s least recently used contexts so the new one
        fits its share (`owner_caps.release_for_share`), or refuse it. One owner's stores queue
        on a lock of that owner's, so two replicas cannot both spend the same room. Returns the
        blobs that went."""
        if store_share(self._settings) is None:
            return []
        await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (OWNER_LOCK_CLASS, owner))
        pins = await _live_pins(conn)
        cur = await conn.execute(
            "SELECT c.context_id, c.sha256, c.bytes, o.last_used_at FROM rlm_contexts c "
            "JOIN rlm_context_owners o ON o.context_id = c.context_id WHERE o.owner = %s",
            (owner,),
        )
        released = releases_in_share(
            self._settings,
            await cur.fetchall(),
            pins,
            owner=owner,
            adding_sha256=ing.sha256,
            adding_bytes=ing.bytes,
            now=now,
        )
        gone: list[str] = []
        for r in released:  # as the owner's delete: the bytes go when nobody holds or runs on them
            await conn.execute(
                "DELETE FROM rlm_context_owners WHERE context_id = %s AND owner = %s", (r.context_id, owner)
            )
            cur = await conn.execute("SELECT 1 FROM rlm_context_owners WHERE context_id = %s", (r.context_id,))
            if await cur.fetchone() is None and not r.in_a_run:
                await conn.execute("DELETE FROM rlm_contexts WHERE context_id = %s", (r.context_id,))
                if await _drop_blob_if_unused(conn, r.sha256):
                    gone.append(r.sha256)
        if released:
            ids = ", ".join(r.context_id for r in released)
            log.info("released %d context(s) of %s for its share: %s", len(released), owner, ids)
        return gone

    # --- reading -------------------------------------------------------------------------

    async def get(self, context_id: str, *, owner: OwnerScope) -> ContextInfo:
        async with self._db.connection() as conn:
            row = await _select(conn, context_id, owner)
        if row is None:
            raise _unknown(context_id)
        return context_info(row)

    async def list(self, *, owner: OwnerScope) -> builtins.list[ContextInfo]:
        async with self._db.connection() as conn:
            if owner is EVERY_OWNER:
                cur = await conn.execute("SELECT * FROM rlm_contexts ORDER BY last_used_at DESC")
            else:
                cur = await conn.execute(_OWNED + " WHERE o.owner = %s ORDER BY o.last_used_at DESC", (owner,))
            rows = await cur.fetchall()
        return [context_info(r) for r in rows]

    def spec(self, info: ContextInfo) -> ContextSpec:
        return ContextSpec(
            path=self.cache.path(info.sha256),
            format=info.format,
            kind=info.kind,
            chars=info.chars,
            bytes=info.bytes,
            name=info.name,
            context_id=info.context_id,
        )

    # --- deleting ------------------------------------------------------------------------

    async def delete(self, context_id: str, *, owner: OwnerScope) -> bool:
        dropped = False
        sha = ""
        async with self._db.transaction() as conn:
            row = await _select(conn, context_id, owner)
            if row is None:
                return False
            sha = row["sha256"]
            await conn.execute("SELECT 1 FROM rlm_contexts WHERE context_id = %s FOR UPDATE", (context_id,))
            pins = await _live_pins(conn)
            if any(cid == context_id and (owner is EVERY_OWNER or p == owner) for cid, p in pins):
                raise BadArgumentError(
                    f"Context '{context_id}' is in use by a running run.",
                    "Wait for the run to finish (or cancel it with rlm_cancel), then delete it.",
                )
            if owner is EVERY_OWNER:
                await conn.execute("DELETE FROM rlm_context_owners WHERE context_id = %s", (context_id,))
            else:
                await conn.execute(
                    "DELETE FROM rlm_context_owners WHERE context_id = %s AND owner = %s", (context_id, owner)
                )
            cur = await conn.execute("SELECT 1 FROM rlm_context_owners WHERE context_id = %s", (context_id,))
            owned = await cur.fetchone() is not None
            if not owned and context_id not in {cid for cid, _ in pins}:
                await conn.execute("DELETE FROM rlm_contexts WHERE context_id = %s", (context_id,))
                dropped = await _drop_blob_if_unused(conn, sha)
        if dropped:
            await anyio.to_thread.run_sync(self.cache.drop, [sha])
        log.info("deleted context %s%s", context_id, "" if owner is EVERY_OWNER else f" of {owner}")
        return True

    # --- pins and eviction ---------------------------------------------------------------

    def in_use(
        self, context_ids: Sequence[str], *, owner: Owner
    ) -> AbstractAsyncContextManager[builtins.list[ContextInfo]]:
        """Resolve `owner`'s ids, pin them in the database (every replica's eviction skips
        them) and make sure this replica's cache holds their bytes, for the block's lifetime."""
        return self._in_use(builtins.list(context_ids), owner)

    @asynccontextmanager
    async def _in_use(self, context_ids: builtins.list[str], owner: Owner) -> AsyncIterator[builtins.list[ContextInfo]]:
        pin_id = secrets.token_hex(8)
        infos = await self._pin(context_ids, pin_id, owner)
        try:
            for info in infos:
                await self.cache.fetch(self._db, info.sha256, info.bytes)
            yield infos
        finally:
            with anyio.CancelScope(shield=True):
                async with self._db.connection() as conn:
                    await conn.execute("DELETE FROM rlm_pins WHERE pin_id = %s", (pin_id,))

    async def _pin(self, context_ids: builtins.list[str], pin_id: str, owner: Owner) -> builtins.list[ContextInfo]:
        now = time.time()
        infos = []
        async with self._db.transaction() as conn:
            for cid in context_ids:
                row = await _select(conn, cid, owner)
                if row is None:
                    raise _unknown(cid)  # the transaction rolls back: no pin is left behind
                await conn.execute("UPDATE rlm_contexts SET last_used_at = %s WHERE context_id = %s", (now, cid))
                await conn.execute(
                    "UPDATE rlm_context_owners SET last_used_at = %s WHERE context_id = %s AND owner = %s",
                    (now, cid, owner),
                )
                await conn.execute(
                    "INSERT INTO rlm_pins VALUES (%s, %s, %s, %s, extract(epoch FROM now()) + %s)",
                    (pin_id, cid, self._db.replica_id, owner, PIN_TTL_S),
                )
                infos.append(context_info(row).model_copy(update={"last_used_at": now}))
        return infos

    async def evict(self, *, keep: Sequence[str] = (), loader: Owner | None = None) -> builtins.list[str]:
        """As the SQLite store's `evict`, over the database: the same rule (`eviction.plan_eviction`)."""
        now = time.time()
        gone: list[str] = []
        async with self._db.transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (EVICT_LOCK_KEY,))
            pinned = {cid for cid, _ in await _live_pins(conn)}
            cur = await conn.execute(
                "SELECT context_id, sha256, bytes, last_used_at, "
                "EXISTS (SELECT 1 FROM rlm_context_owners o WHERE o.context_id = c.context_id) AS owned "
                "FROM rlm_contexts c ORDER BY last_used_at ASC"
            )
            rows = await cur.fetchall()
            owners: dict[str, set[str]] = defaultdict(set)
            cur = await conn.execute("SELECT context_id, owner FROM rlm_context_owners")
            for o in await cur.fetchall():
                owners[o["context_id"]].add(o["owner"])
            planned = plan_eviction(
                rows, owners, settings=self._settings, loader=loader, pinned=pinned, keep=keep, now=now
            )
            for e in planned:
                await conn.execute("DELETE FROM rlm_contexts WHERE context_id = %s", (e.context_id,))
                if e.last_of_blob and await _drop_blob_if_unused(conn, e.sha256):
                    gone.append(e.sha256)
        evicted = [e.context_id for e in planned]
        if gone:
            await anyio.to_thread.run_sync(self.cache.drop, gone)
        if evicted:
            log.info("evicted %d context(s): %s", len(evicted), ", ".join(evicted))
        return evicted
