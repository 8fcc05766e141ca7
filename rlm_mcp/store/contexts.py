"""Contexts on disk, content-addressed, with a SQLite index several processes share.

Layout under `data_dir`:
  contexts/<sha256[:2]>/<sha256>   the bytes (one blob per distinct content)
  index.sqlite3                    metadata, pins, uploads (WAL mode)
  tmp/                             files being written; renamed into place when complete

Ids: `ctx_` + the first 24 hex digits of the sha256 of the bytes. The same bytes stored as
JSON get the suffix `_json` (`ctx_<24 hex>_json`), because a JSON context is a different value
in the sandbox (a list or dict, not a str); both ids share one blob. 24 hex digits = 96 bits:
collisions are out of reach, and the id stays short enough to read and type.

Character counts (`chars`): the number of Unicode code points of the UTF-8 text; for JSON, of
the document's text as stored (not of any value inside it).

Every blob rename and unlink happens while the index's write lock is held, so a delete in one
process can never remove a blob another process has just committed a row for.

Owners (see `rlm_mcp.owners`): the table `context_owners` says who stored which context, with
each owner's own name, source and times. Reads, lists, deletes and pins take the caller's owner
and see only that owner's rows, so the same bytes stored by two owners (one blob, one context
row) reveal nothing across them. `owner=EVERY_OWNER` means every owner: the operator's CLI only.
A delete removes the caller's ownership; the context row and blob go when no owner and no pin
is left (a row orphaned while pinned goes at the next eviction).

Protection from eviction, in every process sharing the index: contexts pinned by a live run
(the `pins` table, judged by pid on this host), and contexts stored or used within
`context_grace_s` (their `last_used_at`), which covers the gap between storing a context and
the run that names it.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import secrets
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, UnknownIdError, context_too_large
from rlm_mcp.owners import EVERY_OWNER, Owner, OwnerScope
from rlm_mcp.ports import ContextFormat, ContextSpec
from rlm_mcp.store import _db
from rlm_mcp.store._ingest import CHUNK, Ingested, ingest, read_file_chunks
from rlm_mcp.store.blob_check import check_blob
from rlm_mcp.store.owner_caps import Held, loader_first, release_for_share, store_share
from rlm_mcp.store.private import PRIVATE_FILE, private_dir

log = logging.getLogger("rlm_mcp.store")

# Pins of another host cannot be checked by pid; they lapse after this long. On this host a
# pin also ends when its process is gone.
PIN_TTL_S = 24 * 3600
# Temp files older than this are leftovers of a crashed process.
STALE_TMP_S = 24 * 3600


class ContextInfo(BaseModel):
    context_id: str
    name: str
    bytes: int
    sha256: str
    format: ContextFormat
    kind: Literal["str", "list", "dict"]
    chars: int
    created_at: float
    last_used_at: float
    source: dict[str, Any]


def context_id_for(sha256: str, format: ContextFormat) -> str:
    return f"ctx_{sha256[:24]}" + ("_json" if format == "json" else "")


def well_formed_id(context_id: str) -> bool:
    """Whether an id could name a context at all: ids are printable ASCII, and a lone surrogate or a
    NUL cannot even be sent to a database driver. Anything else is simply an unknown id, in every store."""
    return context_id.isascii() and context_id.isprintable()


def context_info(row: Any) -> ContextInfo:
    """A stored row (SQLite's or PostgreSQL's, both indexed by column name) as the owner sees it."""
    return ContextInfo(
        context_id=row["context_id"],
        name=row["name"],
        bytes=row["bytes"],
        sha256=row["sha256"],
        format=row["format"],
        kind=row["kind"],
        chars=row["chars"],
        created_at=row["created_at"],
        last_used_at=row["last_used_at"],
        source=json.loads(row["source"]),
    )


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
        share = store_share(self._settings)
        if share is None:
            return
        pins = self._live_pins(conn, now)
        pinned = {cid for cid, pin_owner in pins if pin_owner == owner}
        rows = conn.execute(
            "SELECT c.context_id, c.sha256, c.bytes, o.last_used_at FROM contexts c "
            "JOIN context_owners o ON o.context_id = c.context_id WHERE o.owner = ?",
            (owner,),
        ).fetchall()
        held = [
            Held(r["context_id"], r["sha256"], r["bytes"], r["last_used_at"], r["context_id"] in pinned) for r in rows
        ]
        released = release_for_share(
            held,
            adding_sha256=ing.sha256,
            adding_bytes=ing.bytes,
            share=share,
            now=now,
            grace_s=float(self._settings.context_grace_s),
        )
        shas = {r["context_id"]: r["sha256"] for r in rows}
        in_runs = {cid for cid, _ in pins}
        for context_id in released:  # as the owner's delete: the bytes go when nobody holds or runs on them
            conn.execute("DELETE FROM context_owners WHERE context_id = ? AND owner = ?", (context_id, owner))
            if not self._owned(conn, context_id) and context_id not in in_runs:
                self._drop_context(conn, context_id, shas[context_id])
        if released:
            log.info("released %d context(s) of %s for its share: %s", len(released), owner, ", ".join(released))

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
                pins = self._live_pins(conn, now)
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
        pid = os.getpid()
        start = _db.proc_start(pid)
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
                conn.execute(
                    "INSERT INTO pins VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (pin_id, cid, _db.HOST, pid, start, now + PIN_TTL_S, owner),
                )
                infos.append(context_info(row).model_copy(update={"last_used_at": now}))
        return infos

    def _unpin(self, pin_id: str) -> None:
        with _db.write_txn(self.db_path) as conn:
            conn.execute("DELETE FROM pins WHERE pin_id = ?", (pin_id,))

    def _live_pins(self, conn: sqlite3.Connection, now: float) -> set[tuple[str, str | None]]:
        """(context_id, owner) of every live pin; dead ones are removed on the way."""
        live: set[tuple[str, str | None]] = set()
        for pin in conn.execute("SELECT rowid, * FROM pins").fetchall():
            alive = pin["expires_at"] > now and (
                pin["host"] != _db.HOST or _db.pid_alive(pin["pid"], pin["proc_start"])
            )
            if alive:
                live.add((pin["context_id"], pin["owner"]))
            else:
                conn.execute("DELETE FROM pins WHERE rowid = ?", (pin["rowid"],))
        return live

    async def evict(self, *, keep: Sequence[str] = (), loader: Owner | None = None) -> builtins.list[str]:
        """Evict unpinned contexts: rows no owner holds any more, those unused for
        store_max_age_days (<= 0: no age cap), then least recently used ones until the blobs
        fit store_max_bytes. Never a context stored or used within context_grace_s. `keep`
        protects ids too (a put protects what it just stored, even when it alone exceeds the
        cap). With `loader` (who just stored), that owner's own contexts go first
        (`owner_caps.loader_first`). Returns the evicted ids."""
        return await _db.in_thread(lambda: self._evict(set(keep), loader))

    def _evict(self, keep: set[str], loader: Owner | None) -> builtins.list[str]:
        if not self.db_path.exists():
            return []
        now = time.time()
        max_age = float(self._settings.store_max_age_days) * 86400
        cap = self._settings.store_max_bytes
        evicted: list[str] = []
        grace = float(self._settings.context_grace_s)
        with _db.write_txn(self.db_path) as conn:
            pinned = {cid for cid, _ in self._live_pins(conn, now)}
            rows = conn.execute(
                "SELECT context_id, sha256, bytes, last_used_at, "
                "EXISTS (SELECT 1 FROM context_owners o WHERE o.context_id = c.context_id) AS owned "
                "FROM contexts c ORDER BY last_used_at ASC"
            ).fetchall()
            owners: dict[str, set[str]] = defaultdict(set)
            for o in conn.execute("SELECT context_id, owner FROM context_owners"):
                owners[o["context_id"]].add(o["owner"])
            rows = loader_first(rows, owners, loader)
            refs = Counter(r["sha256"] for r in rows)
            sizes = {r["sha256"]: r["bytes"] for r in rows}
            total = sum(sizes.values())  # blobs are shared: count each content once
            for r in rows:
                if r["context_id"] in pinned:
                    continue
                orphan = not r["owned"]  # deleted by every owner while a run still held it
                if not orphan:
                    if r["context_id"] in keep or now - r["last_used_at"] < grace:
                        continue
                    expired = max_age > 0 and now - r["last_used_at"] > max_age
                    if not expired and total <= cap:
                        continue
                conn.execute("DELETE FROM contexts WHERE context_id = ?", (r["context_id"],))
                conn.execute("DELETE FROM context_owners WHERE context_id = ?", (r["context_id"],))
                evicted.append(r["context_id"])
                refs[r["sha256"]] -= 1
                if refs[r["sha256"]] == 0:
                    total -= sizes[r["sha256"]]
                    self.blob_path(r["sha256"]).unlink(missing_ok=True)
        self._clean_tmp(now)
        if evicted:
            log.info("evicted %d context(s): %s", len(evicted), ", ".join(evicted))
        return evicted

    def _clean_tmp(self, now: float) -> None:
        try:
            entries = list(os.scandir(self.tmp_dir))
        except FileNotFoundError:
            return
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False) and now - entry.stat().st_mtime > STALE_TMP_S:
                    os.unlink(entry.path)
            except OSError:
                pass  # another process removed or renamed it first
