"""Uploads in the embedded store: their state in the SQLite index (table `uploads`), their
chunks in files under `data_dir/uploads/<upload_id>/<index>.part`, so an upload survives a
server restart and may continue on another server process sharing the data dir. Implements
`store.index.UploadIndex` for the rules in `store.uploads`.

A chunk is written to a temp file before the index's lock is taken (`stage`) and renamed into
place under it. The final chunk's mark is a file (`finalizing`) beside the chunks, created and
checked only inside the index's write transaction, so every process agrees on it.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import StoreSettings
from rlm_mcp.store import _db
from rlm_mcp.store.index import Row
from rlm_mcp.store.sqlite_index import ContextStore, SqliteContextIndex
from rlm_mcp.store.sqlite_tx import SqliteTx, transaction
from rlm_mcp.store.statements import SQLITE
from rlm_mcp.store.uploads import Uploads

__all__ = ["SqliteUploadIndex", "UploadStore"]

log = logging.getLogger("rlm_mcp.store")


class SqliteUploadTx(SqliteTx):
    def __init__(self, index: SqliteUploadIndex, *, write: bool) -> None:
        super().__init__(index.db_path, write=write, clock=index.clock)
        self._index = index

    async def expire(self, cutoff: float) -> None:
        await self.run(lambda conn: self._index.expire(conn, cutoff))

    async def add_chunk(self, upload_id: str, index: int, staged: Any) -> None:
        def place(conn: sqlite3.Connection) -> None:
            self._index.dir_of(upload_id).mkdir(exist_ok=True)
            os.replace(staged, self._index.chunk_path(upload_id, index))

        await self.run(place)

    async def is_finalizing(self, row: Row) -> bool:
        marker = self._index.marker(row["upload_id"])
        return await self.run(lambda conn: marker.exists())

    async def set_finalizing(self, upload_id: str) -> None:
        marker = self._index.marker(upload_id)
        await self.run(lambda conn: marker.touch())


class SqliteUploadIndex:
    sql = SQLITE

    def __init__(self, contexts: SqliteContextIndex) -> None:
        self._contexts = contexts
        self.root = contexts.root / "uploads"
        self.db_path = contexts.db_path

    def clock(self) -> float:
        """This process's clock, the context index's (one clock per data dir)."""
        return self._contexts.clock()

    def dir_of(self, upload_id: str) -> Path:
        return self.root / upload_id

    def chunk_path(self, upload_id: str, index: int) -> Path:
        return self.root / upload_id / f"{index:08d}.part"

    def marker(self, upload_id: str) -> Path:
        """Present while the final chunk is being stored: appends are refused meanwhile (they
        would be acknowledged and missing from the context)."""
        return self.root / upload_id / "finalizing"

    def read(self) -> AbstractAsyncContextManager[SqliteUploadTx]:
        return transaction(SqliteUploadTx(self, write=False))

    def write(self) -> AbstractAsyncContextManager[SqliteUploadTx]:
        return transaction(SqliteUploadTx(self, write=True))

    async def stage(self, data: bytes) -> Path:
        def write() -> Path:
            self._contexts.prepare()
            self.root.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.root, prefix=".chunk-", suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return Path(name)

        return await _db.in_thread(write)

    async def discard(self, staged: Any) -> None:
        await anyio.Path(staged).unlink(missing_ok=True)

    async def clear_finalizing(self, upload_id: str) -> None:
        await anyio.Path(self.marker(upload_id)).unlink(missing_ok=True)

    @asynccontextmanager
    async def assembled(self, upload_id: str, count: int) -> AsyncIterator[Iterable[bytes] | Path]:
        def chunks() -> Iterator[bytes]:
            for i in range(count):
                yield self.chunk_path(upload_id, i).read_bytes()

        yield chunks()

    async def finished(self, upload_id: str) -> None:
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(self.dir_of(upload_id), ignore_errors=True))

    def expire(self, conn: sqlite3.Connection, cutoff: float) -> None:
        """Inside the caller's write transaction: rows untouched since `cutoff` go with their
        chunk folders, and so do folders without a row (a crash between the folder and its row,
        or a leftover temp file) untouched as long."""
        stale = [r["upload_id"] for r in conn.execute(SQLITE.stale_uploads, (cutoff,))]
        conn.execute(SQLITE.expire_uploads, (cutoff,))
        known = {r["upload_id"] for r in conn.execute(SQLITE.upload_ids)}
        for upload_id in stale:
            shutil.rmtree(self.dir_of(upload_id), ignore_errors=True)
        for entry in os.scandir(self.root):
            try:
                if entry.name not in known and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
            except OSError:
                pass
        if stale:
            log.info("expired %d upload(s)", len(stale))


class UploadStore(Uploads):
    """The embedded store's uploads: rows in the data dir's SQLite index, chunks in files."""

    def __init__(self, settings: StoreSettings, contexts: ContextStore) -> None:
        super().__init__(settings, contexts, SqliteUploadIndex(contexts.files))
