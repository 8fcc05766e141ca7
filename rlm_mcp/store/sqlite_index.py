"""The embedded index: SQLite (`index.sqlite3`, shared by every process on a data dir) and blob
files, content-addressed, under the data dir. Implements `store.index` for the rules in
`store.contexts`.

Layout under `data_dir`:
  contexts/<sha256[:2]>/<sha256>   the bytes (one blob per distinct content)
  index.sqlite3                    metadata, pins, uploads (WAL mode; `store._db`)
  tmp/                             files being written; renamed into place when complete

A transaction (`transaction`) takes the index's write lock in a worker thread and runs each of
its statements in a worker thread too, one at a time, on threads of its own (a private
capacity limiter): writers queued on the lock cannot starve the holder of threads. Every blob
rename and unlink happens inside a write transaction, so a delete in one process can never
remove a blob another process has just committed a row for.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio

from rlm_mcp.owners import Owner
from rlm_mcp.store import _db
from rlm_mcp.store._ingest import Ingested
from rlm_mcp.store.blob_check import check_blob
from rlm_mcp.store.context_model import ContextInfo
from rlm_mcp.store.index import Row
from rlm_mcp.store.pins import add_pins, live_pins
from rlm_mcp.store.private import PRIVATE_FILE, private_dir
from rlm_mcp.store.statements import SQLITE

__all__ = ["SqliteContextIndex", "SqliteTx", "transaction"]

T = TypeVar("T")


class SqliteTx:
    """Statements on one connection inside `transaction`, each in a worker thread."""

    def __init__(self, conn: sqlite3.Connection, limiter: anyio.CapacityLimiter) -> None:
        self.conn = conn
        self._limiter = limiter

    async def run(self, func: Callable[[], T]) -> T:
        """Blocking work of this transaction (statements, file moves) in a worker thread."""
        return await anyio.to_thread.run_sync(func, limiter=self._limiter)

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return await self.run(lambda: self.conn.execute(sql, params).fetchone())

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self.run(lambda: self.conn.execute(sql, params).fetchall())

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self.run(lambda: self.conn.execute(sql, params))

    async def lock_owner(self, owner: Owner) -> None:
        return None  # the write transaction already excludes every other writer


@asynccontextmanager
async def transaction(
    db_path: Path, *, write: bool, limiter: anyio.CapacityLimiter
) -> AsyncIterator[sqlite3.Connection]:
    """A connection inside BEGIN IMMEDIATE (`write`) or a reading one, entered in a worker
    thread (which may wait for the lock), used and left on `limiter`'s threads. Entering is
    shielded: a connection the thread took is always given back."""
    cm: AbstractContextManager[sqlite3.Connection] = _db.write_txn(db_path) if write else _db.connect(db_path)
    with anyio.CancelScope(shield=True):
        conn = await _db.in_thread(cm.__enter__)
    try:
        yield conn
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            leave = functools.partial(cm.__exit__, type(exc), exc, exc.__traceback__)
            await anyio.to_thread.run_sync(leave, limiter=limiter)
        raise
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(lambda: cm.__exit__(None, None, None), limiter=limiter)


class SqliteContextTx(SqliteTx):
    def __init__(self, conn: sqlite3.Connection, limiter: anyio.CapacityLimiter, index: SqliteContextIndex) -> None:
        super().__init__(conn, limiter)
        self._index = index

    async def lock_context(self, context_id: str) -> None:
        return None

    async def lock_eviction(self) -> None:
        return None

    async def live_pins(self, now: float) -> set[tuple[str, str | None]]:
        return await self.run(lambda: live_pins(self.conn, now))

    async def add_pins(self, pin_id: str, context_ids: Sequence[str], owner: Owner, now: float) -> None:
        await self.run(lambda: add_pins(self.conn, pin_id, context_ids, owner, now))

    async def put_blob(self, ing: Ingested, owner: Owner) -> None:
        blob = self._index.local_path(ing.sha256)

        def move() -> None:
            blob.parent.mkdir(parents=True, exist_ok=True)
            if blob.exists() and blob.stat().st_size == ing.bytes:
                ing.tmp_path.unlink(missing_ok=True)  # same content already stored
            else:
                os.chmod(ing.tmp_path, PRIVATE_FILE)
                os.replace(ing.tmp_path, blob)

        await self.run(move)

    async def release_blob(self, sha256: str) -> None:
        def release() -> None:
            if self.conn.execute(SQLITE.sha_in_use, (sha256,)).fetchone() is None:
                self._index.local_path(sha256).unlink(missing_ok=True)

        await self.run(release)

    async def blob_intact(self, row: Row) -> bool:
        path = self._index.local_path(row["sha256"])
        return await self.run(lambda: check_blob(path, row["bytes"], row["context_id"]))


class SqliteContextIndex:
    """Contexts' rows in the data dir's SQLite index, their bytes in files beside it."""

    sql = SQLITE

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir)
        self.db_path = self.root / "index.sqlite3"
        self.blobs = self.root / "contexts"
        self.tmp_dir = self.root / "tmp"

    def prepare(self) -> None:
        # 0700, also when made beforehand: contexts are often private documents (blobs are 0600;
        # a sandbox receives them over its stream, never by a mount).
        private_dir(self.root)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def local_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    def read(self) -> AbstractAsyncContextManager[SqliteContextTx]:
        return self._tx(write=False)

    def write(self) -> AbstractAsyncContextManager[SqliteContextTx]:
        return self._tx(write=True)

    @asynccontextmanager
    async def _tx(self, *, write: bool) -> AsyncIterator[SqliteContextTx]:
        limiter = anyio.CapacityLimiter(1)
        async with transaction(self.db_path, write=write, limiter=limiter) as conn:
            yield SqliteContextTx(conn, limiter, self)

    async def present(self) -> bool:
        return await anyio.Path(self.db_path).exists()

    async def adopt(self, ing: Ingested) -> None:
        return None  # `put_blob` moved the bytes into place

    async def make_local(self, infos: Sequence[ContextInfo]) -> None:
        return None  # blob files are local
