"""Contexts on disk, content-addressed, with a SQLite index several processes share.

Layout under `data_dir`:
  contexts/<sha256[:2]>/<sha256>   the bytes (one blob per distinct content)
  index.sqlite3                    metadata, pins, uploads (WAL mode)
  tmp/                             files being written; renamed into place when complete

Ids, character counts and `ContextInfo`: `context_model` (the same in every store).

Every blob rename and unlink happens while the index's write lock is held, so a delete in one
process can never remove a blob another process has just committed a row for.

Owners (see `rlm_mcp.owners`): the table `context_owners` says who stored which context, with
each owner's own name, source and times. Reads, lists, deletes and pins take the caller's owner
and see only that owner's rows, so the same bytes stored by two owners (one blob, one context
row) reveal nothing across them. `owner=EVERY_OWNER` means every owner: the operator's CLI only.
A delete removes the caller's ownership; the context row and blob go when no owner and no pin
is left (a row orphaned while pinned goes at the next eviction).

Protection from eviction, in every process sharing the index: contexts pinned by a live run
(the `pins` table, judged by pid on this host: `pins`), and contexts stored or used within
`context_grace_s` (their `last_used_at`), which covers the gap between storing a context and
the run that names it. Which contexts an eviction removes: `eviction.plan_eviction`.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import secrets
import sqlite3
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
from rlm_mcp.store import _db
from rlm_mcp.store._ingest import CHUNK, Ingested, ingest, read_file_chunks
from rlm_mcp.store.blob_check import check_blob
from rlm_mcp.store.context_model import ContextInfo, context_id_for, context_info, well_formed_id
from rlm_mcp.store.eviction import clean_stale_tmp, plan_eviction
from rlm_mcp.store.owner_caps import releases_in_share, store_share
from rlm_mcp.store.pins import add_pins, live_pins, remove_pin
from rlm_mcp.store.private import PRIVATE_FILE, private_dir

__all__ = ["ContextStore"]

log = logging.getLogger("rlm_mcp.store")


def _unknown(context_id: str) -> UnknownIdError:
    return UnknownIdError("context", context_id)


# A context as one owner sees it: the shared content facts, the owner's own name, source, times.
_OWNED = (
    "SELECT c.context_id, c.sha256, c.bytes, c.format, c.kind, c.chars, "
    "o.name, o.source, o.created_at, o.last_used_at "
    "FROM contexts c JOIN context_owners o ON o.context_id = c.context_id"
)


def _select(conn: sqlite3.Connection, context_id: str, owner: OwnerScope) -> sqlite3.Row | None:
    if not well_formed_id(context_id):
        return None
    if owner is EVERY_OWNER:
        cursor = conn.execute("SELECT * FROM contexts WHERE context_id = ?", (context_id,))
    else:
        cursor = conn.execute(_OWNED + " WHERE c.context_id = ? AND o.owner = ?", (context_id, owner))
    row: sqlite3.Row | None = cursor.fetchone()
    return row


class ContextStore:
    """Stored contexts. Safe to use from several processes on one data dir."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._root = Path(settings.data_dir)
        self.db_path = self._root / "index.sqlite3"
        self._blobs = self._root / "contexts"
        self.tmp_dir = self._root / "tmp"

    # --- paths ---------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self._blobs / sha256[:2] / sha256

    def _prepare(self) -> None:
        # 0700, also when made beforehand: contexts are often private documents (blobs are 0600;
        # a sandbox receives them over its stream, never by a mount).
        private_dir(self._root)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    # --- writing -------------------------------------------------------------------------

    async def put_bytes(
        self,
        data: bytes,
        *,
        name: str,
        format: ContextFormat,
        source: dict[str, Any],
        owner: Owner,
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
        """Store a file's bytes, streaming. With consume=True the file (a temp file the caller
        owns, e.g. a loader's output) is moved into the store instead of copied when it lives
        on the same filesystem; the caller's later delete must tolerate it being gone."""
        path = Path(path)

        def work() -> ContextInfo:
            self._prepare()
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise BadArgumentError(f"File '{path}' does not exist.", "Check the path and load it again.") from None
            if size > self._settings.max_context_bytes:
                raise context_too_large(self._settings.max_context_bytes)
            same_fs = consume and path.stat().st_dev == self.tmp_dir.stat().st_dev
            ing = ingest(
                read_file_chunks(path),
                tmp_dir=self.tmp_dir,
                format=format,
                max_bytes=self._settings.max_context_bytes,
                write=not same_fs,
                existing=path if same_fs else None,
            )
            return self._commit(ing, name=name, format=format, source=source, owner=owner)

        info = await _db.in_thread(work)
        await self.evict(keep=[info.context_id], loader=owner)
        return info

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
        """Store bytes given as a (blocking) iterable of chunks, consumed in a worker thread."""

        def work() -> ContextInfo:
            self._prepare()
            ing = ingest(
                chunks,
                tmp_dir=self.tmp_dir,
                format=format,
                max_bytes=self._settings.max_context_bytes,
                expected_sha256=expected_sha256,
            )
            return self._commit(ing, name=name, format=format, source=source, owner=owner)

        info = await _db.in_thread(work)
        await self.evict(keep=[info.context_id], loader=owner)
        return info

    def _commit(
        self, ing: Ingested, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo:
        cid = context_id_for(ing.sha256, format)
        blob = self.blob_path(ing.sha256)
        blob.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        try:
            with _db.write_txn(self.db_path) as conn:
                self._make_room_in_share(conn, owner, ing, now)  # before the blob moves: a refusal leaves nothing
                if blob.exists() and blob.stat().st_size == ing.bytes:
                    ing.tmp_path.unlink(missing_ok=True)  # same content already stored
                else:
                    os.chmod(ing.tmp_path, PRIVATE_FILE)
                    os.replace(ing.tmp_path, blob)
                exists = conn.execute("SELECT 1 FROM contexts WHERE context_id = ?", (cid,)).fetchone()
                if exists:
                    # Same bytes again: one context row (its name is the operator's view only).
                    conn.execute(
                        "UPDATE contexts SET name = ?, source = ?, last_used_at = ? WHERE context_id = ?",
                        (name, json.dumps(source), now, cid),
                    )
                else:
                    conn.execute(
                        "INSERT INTO contexts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (cid, ing.sha256, name, ing.bytes, format, ing.kind, ing.chars, now, now, json.dumps(source)),
                    )
                # Each owner has its own row: the latest name and source it gave describe it.
                conn.execute(
                    "INSERT INTO context_owners VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (context_id, owner) "
                    "DO UPDATE SET name = excluded.name, source = excluded.source, last_used_at = excluded.last_used_at",
                    (cid, owner, name, json.dumps(source), now, now),
                )
                row = _select(conn, cid, owner)
                assert row is not None  # written just above, in this transaction
        finally:
            ing.tmp_path.unlink(missing_ok=True)
        log.info("stored context %s (%d bytes, %s)", cid, ing.bytes, format)
        return context_info(row)

    def _make_room_in_share(self, conn: sqlite3.Connection, owner: Owner, ing: Ingested, now: float) -> None:
        """Release `owner`'s least recently used contexts so the new one fits its share of the
        store (`owner_caps.release_for_share`), or refuse it."""
        if store_share(self._settings) is None:
            return
        rows = conn.execute(
            "SELECT c.context_id, c.sha256, c.bytes, o.last_used_at FROM contexts c "
            "JOIN context_owners o ON o.context_id = c.context_id WHERE o.owner = ?",
            (owner,),
        ).fetchall()
        released = releases_in_share(
            self._settings,
            rows,
            live_pins(conn, now),
            owner=owner,
            adding_sha256=ing.sha256,
            adding_bytes=ing.bytes,
            now=now,
        )
        for r in released:  # as the owner's delete: the bytes go when nobody holds or runs on them
            conn.execute("DELETE FROM context_owners WHERE context_id = ? AND owner = ?", (r.context_id, owner))
            if not self._owned(conn, r.context_id) and not r.in_a_run:
                self._drop_context(conn, r.context_id, r.sha256)
        if released:
            ids = ", ".join(r.context_id for r in released)
            log.info("released %d context(s) of %s for its share: %s", len(released), owner, ids)

    # --- reading -------------------------------------------------------------------------

    async def get(self, context_id: str, *, owner: OwnerScope) -> ContextInfo:
        """The context as `owner` sees it; NotFoundError when that owner has none by this id."""

        def work() -> ContextInfo:
            with _db.connect(self.db_path) as conn:
                row = _select(conn, context_id, owner)
            if row is None:
                raise _unknown(context_id)
            return context_info(row)

        return await _db.in_thread(work)

    async def list(self, *, owner: OwnerScope) -> list[ContextInfo]:
        def work() -> list[ContextInfo]:
            with _db.connect(self.db_path) as conn:
                if owner is EVERY_OWNER:
                    rows = conn.execute("SELECT * FROM contexts ORDER BY last_used_at DESC").fetchall()
                else:
                    query = _OWNED + " WHERE o.owner = ? ORDER BY o.last_used_at DESC"
                    rows = conn.execute(query, (owner,)).fetchall()
            return [context_info(r) for r in rows]

        return await _db.in_thread(work)

    def spec(self, info: ContextInfo) -> ContextSpec:
        return ContextSpec(
            path=self.blob_path(info.sha256),
            format=info.format,
            kind=info.kind,
            chars=info.chars,
            bytes=info.bytes,
            name=info.name,
            context_id=info.context_id,
        )

    # --- deleting ------------------------------------------------------------------------

    async def delete(self, context_id: str, *, owner: OwnerScope) -> bool:
        """False when `owner` has no context by this id. A context a live run of the same owner
        is using cannot be deleted (runs of other owners keep only the bytes alive, unseen)."""

        def work() -> bool:
            now = time.time()
            with _db.write_txn(self.db_path) as conn:
                row = _select(conn, context_id, owner)
                if row is None:
                    return False
                pins = live_pins(conn, now)
                if any(cid == context_id and (owner is EVERY_OWNER or pin_owner == owner) for cid, pin_owner in pins):
                    raise BadArgumentError(
                        f"Context '{context_id}' is in use by a running run.",
                        "Wait for the run to finish (or cancel it with rlm_cancel), then delete it.",
                    )
                if owner is EVERY_OWNER:
                    conn.execute("DELETE FROM context_owners WHERE context_id = ?", (context_id,))
                else:
                    conn.execute("DELETE FROM context_owners WHERE context_id = ? AND owner = ?", (context_id, owner))
                if not self._owned(conn, context_id) and context_id not in {cid for cid, _ in pins}:
                    self._drop_context(conn, context_id, row["sha256"])
            log.info("deleted context %s%s", context_id, "" if owner is EVERY_OWNER else f" of {owner}")
            return True

        return await _db.in_thread(work)

    @staticmethod
    def _owned(conn: sqlite3.Connection, context_id: str) -> bool:
        return conn.execute("SELECT 1 FROM context_owners WHERE context_id = ?", (context_id,)).fetchone() is not None

    def _drop_context(self, conn: sqlite3.Connection, context_id: str, sha256: str) -> None:
        conn.execute("DELETE FROM contexts WHERE context_id = ?", (context_id,))
        conn.execute("DELETE FROM context_owners WHERE context_id = ?", (context_id,))
        self._drop_blob_if_unused(conn, sha256)

    def _drop_blob_if_unused(self, conn: sqlite3.Connection, sha256: str) -> None:
        if conn.execute("SELECT 1 FROM contexts WHERE sha256 = ?", (sha256,)).fetchone() is None:
            self.blob_path(sha256).unlink(missing_ok=True)

    # --- pins and eviction ---------------------------------------------------------------

    def in_use(
        self, context_ids: Sequence[str], *, owner: Owner
    ) -> AbstractAsyncContextManager[builtins.list[ContextInfo]]:
        """Resolve `owner`'s ids (NotFoundError), mark them used and pin them for the block's lifetime.

        Pins are rows in the shared index, so eviction in another process skips them too. A pin
        whose process died is ignored (same host: pid check; other hosts: PIN_TTL_S)."""
        return self._in_use(list(context_ids), owner)

    @asynccontextmanager
    async def _in_use(self, context_ids: builtins.list[str], owner: Owner) -> AsyncIterator[builtins.list[ContextInfo]]:
        pin_id = secrets.token_hex(8)
        infos = await _db.in_thread(lambda: self._pin(context_ids, pin_id, owner))
        try:
            yield infos
        finally:
            # Shielded: a cancelled run must still release its pins.
            with anyio.CancelScope(shield=True):
                await _db.in_thread(lambda: self._unpin(pin_id))

    def _pin(self, context_ids: builtins.list[str], pin_id: str, owner: Owner) -> builtins.list[ContextInfo]:
        now = time.time()
        with _db.write_txn(self.db_path) as conn:
            infos = []
            for cid in context_ids:
                row = _select(conn, cid, owner)
                if row is None or not check_blob(self.blob_path(row["sha256"]), row["bytes"], cid):
                    raise _unknown(cid)  # the transaction rolls back: no pin is left behind
                conn.execute("UPDATE contexts SET last_used_at = ? WHERE context_id = ?", (now, cid))
                conn.execute(
                    "UPDATE context_owners SET last_used_at = ? WHERE context_id = ? AND owner = ?", (now, cid, owner)
                )
                infos.append(context_info(row).model_copy(update={"last_used_at": now}))
            add_pins(conn, pin_id, context_ids, owner, now)
        return infos

    def _unpin(self, pin_id: str) -> None:
        with _db.write_txn(self.db_path) as conn:
            remove_pin(conn, pin_id)

    async def evict(self, *, keep: Sequence[str] = (), loader: Owner | None = None) -> builtins.list[str]:
        """Evict what `eviction.plan_eviction` names: unpinned contexts no owner holds any more,
        those past store_max_age_days, then least recently used ones until the blobs fit
        store_max_bytes; never one stored or used within context_grace_s, nor one in `keep` (a
        put protects what it just stored, even when it alone exceeds the cap). With `loader`
        (who just stored), that owner's own contexts go first. Returns the evicted ids."""
        return await _db.in_thread(lambda: self._evict(set(keep), loader))

    def _evict(self, keep: set[str], loader: Owner | None) -> builtins.list[str]:
        if not self.db_path.exists():
            return []
        now = time.time()
        with _db.write_txn(self.db_path) as conn:
            pinned = {cid for cid, _ in live_pins(conn, now)}
            rows = conn.execute(
                "SELECT context_id, sha256, bytes, last_used_at, "
                "EXISTS (SELECT 1 FROM context_owners o WHERE o.context_id = c.context_id) AS owned "
                "FROM contexts c ORDER BY last_used_at ASC"
            ).fetchall()
            owners: dict[str, set[str]] = defaultdict(set)
            for o in conn.execute("SELECT context_id, owner FROM context_owners"):
                owners[o["context_id"]].add(o["owner"])
            planned = plan_eviction(
                rows, owners, settings=self._settings, loader=loader, pinned=pinned, keep=keep, now=now
            )
            for e in planned:
                conn.execute("DELETE FROM contexts WHERE context_id = ?", (e.context_id,))
                conn.execute("DELETE FROM context_owners WHERE context_id = ?", (e.context_id,))
                if e.last_of_blob:
                    self.blob_path(e.sha256).unlink(missing_ok=True)
        clean_stale_tmp(self.tmp_dir, now)
        evicted = [e.context_id for e in planned]
        if evicted:
            log.info("evicted %d context(s): %s", len(evicted), ", ".join(evicted))
        return evicted
