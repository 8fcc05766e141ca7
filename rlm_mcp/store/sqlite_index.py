"""The embedded index: SQLite (`index.sqlite3`, shared by every process on a data dir) and blob
files, content-addressed, under the data dir. Implements `store.index` for the rules in
`store.contexts`.

Layout under `data_dir`:
  contexts/<sha256[:2]>/<sha256>   the bytes (one blob per distinct content)
  index.sqlite3                    metadata, pins, uploads (WAL mode; `store._db`)
  tmp/                             files being written; renamed into place when complete

Transactions: `store.sqlite_tx`. Every blob rename and unlink happens inside a write
transaction, so a delete in one process can never remove a blob another process has just
committed a row for.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

import anyio

from rlm_mcp.config import StoreSettings
from rlm_mcp.owners import Owner, OwnerScope
from rlm_mcp.store import _db
from rlm_mcp.store._ingest import Ingested
from rlm_mcp.store.blob_check import check_blob
from rlm_mcp.store.context_model import ContextInfo, context_info
from rlm_mcp.store.contexts import Contexts, unknown_context
from rlm_mcp.store.index import Row
from rlm_mcp.store.pins import ADD_PIN, live_pins, pin_rows
from rlm_mcp.store.private import PRIVATE_FILE, private_dir
from rlm_mcp.store.sqlite_tx import SqliteTx, transaction
from rlm_mcp.store.statements import SQLITE

__all__ = ["ContextStore", "SqliteContextIndex", "SqliteContextTx"]

T = TypeVar("T")


class SqliteContextTx(SqliteTx):
    def __init__(self, index: SqliteContextIndex, *, write: bool) -> None:
        super().__init__(index.db_path, write=write, clock=index.clock)
        self._index = index

    async def lock_context(self, context_id: str) -> None:
        return None

    async def lock_eviction(self) -> None:
        return None

    async def live_pins(self, now: float) -> set[tuple[str, str | None]]:
        return await self.run(lambda conn: live_pins(conn, now))

    async def add_pins(self, pin_id: str, context_ids: Sequence[str], owner: Owner, now: float) -> None:
        for row in pin_rows(pin_id, context_ids, owner, now):
            await self.execute(ADD_PIN, row)

    async def put_blob(self, ing: Ingested, owner: Owner) -> None:
        blob = self._index.local_path(ing.sha256)

        def move(conn: sqlite3.Connection) -> None:
            blob.parent.mkdir(parents=True, exist_ok=True)
            if blob.exists() and blob.stat().st_size == ing.bytes:
                ing.tmp_path.unlink(missing_ok=True)  # same content already stored
            else:
                os.chmod(ing.tmp_path, PRIVATE_FILE)
                os.replace(ing.tmp_path, blob)

        await self.run(move)

    async def release_blob(self, sha256: str) -> None:
        def release(conn: sqlite3.Connection) -> None:
            if conn.execute(SQLITE.sha_in_use, (sha256,)).fetchone() is None:
                self._index.local_path(sha256).unlink(missing_ok=True)

        await self.run(release)

    async def blob_intact(self, row: Row) -> bool:
        path = self._index.local_path(row["sha256"])
        return await self.run(lambda conn: check_blob(path, row["bytes"], row["context_id"]))


class SqliteContextIndex:
    """Contexts' rows in the data dir's SQLite index, their bytes in files beside it."""

    sql = SQLITE

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir)
        self.db_path = self.root / "index.sqlite3"
        self.blobs = self.root / "contexts"
        self.tmp_dir = self.root / "tmp"
        self.clock: Callable[[], float] = time.time  # the transactions' `now`: every process here shares it

    def prepare(self) -> None:
        # 0700, also when made beforehand: contexts are often private documents (blobs are 0600;
        # a sandbox receives them over its stream, never by a mount).
        private_dir(self.root)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def local_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    def read(self) -> AbstractAsyncContextManager[SqliteContextTx]:
        return transaction(SqliteContextTx(self, write=False))

    def write(self) -> AbstractAsyncContextManager[SqliteContextTx]:
        return transaction(SqliteContextTx(self, write=True))

    async def present(self) -> bool:
        return await anyio.Path(self.db_path).exists()

    async def adopt(self, ing: Ingested) -> None:
        return None  # `put_blob` moved the bytes into place

    async def make_local(self, infos: Sequence[ContextInfo]) -> None:
        return None  # blob files are local

    async def in_one_step(self, work: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        """`work` as one whole transaction (`write`) or read, in ONE worker-thread hop.

        A `SqliteTx` takes a hop per statement whose result it needs and one more to commit; a
        hop costs more than the statements (0.3-1.5 ms on a loaded 2-core host, against tens of
        microseconds of SQLite), and a run's start waits for its context read and its pins."""

        def step() -> T:
            with _db.write_txn(self.db_path) if write else _db.connect(self.db_path) as conn:
                return work(conn)

        return await _db.in_thread(step)

    async def quick_read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` (a read of a few rows) on the event loop when that cannot wait (`_db.read_here`),
        else in one worker-thread hop."""
        done = _db.read_here(self.db_path, work)
        if done is not None:
            return done[0]
        return await self.in_one_step(work, write=False)


class ContextStore(Contexts):
    """The embedded store: the SQLite index and blob files under `settings.data_dir`."""

    def __init__(self, settings: StoreSettings) -> None:
        self.files = SqliteContextIndex(Path(settings.data_dir))
        super().__init__(settings, self.files)
        self.db_path = self.files.db_path

    def blob_path(self, sha256: str) -> Path:
        return self.files.local_path(sha256)

    # A run's start reads its contexts (`get`, when the call is checked) and pins them (`_pin`):
    # the same rules as `Contexts`'; the read on the event loop unless it would wait (the call's
    # admission waits for it), the pins in one worker-thread hop instead of three.

    async def get(self, context_id: str, *, owner: OwnerScope) -> ContextInfo:
        selecting = self._selecting(context_id, owner)
        row = None
        if selecting is not None:
            row = await self.files.quick_read(lambda conn: conn.execute(*selecting).fetchone())
        if row is None:
            raise unknown_context(context_id)
        return context_info(row)

    async def _pin(self, context_ids: list[str], pin_id: str, owner: Owner) -> list[ContextInfo]:
        now = self.files.clock()  # the transaction's `now`, read once
        sql, files = self._sql, self.files
        selecting = [(cid, self._selecting(cid, owner)) for cid in context_ids]

        def pin(conn: sqlite3.Connection) -> list[ContextInfo]:
            infos = []
            for cid, select in selecting:
                row = conn.execute(*select).fetchone() if select is not None else None
                if row is None or not check_blob(files.local_path(row["sha256"]), row["bytes"], row["context_id"]):
                    raise unknown_context(cid)  # the transaction rolls back: no pin is left behind
                conn.execute(sql.touch_context, (now, cid))
                conn.execute(sql.touch_ownership, (now, cid, owner))
                infos.append(context_info(row).model_copy(update={"last_used_at": now}))
            for values in pin_rows(pin_id, context_ids, owner, now):
                conn.execute(ADD_PIN, values)
            return infos

        return await files.in_one_step(pin, write=True)

    def _prepare(self) -> None:
        self.files.prepare()
