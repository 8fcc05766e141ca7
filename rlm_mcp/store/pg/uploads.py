"""Uploads in PostgreSQL (team mode): the index beneath `store.uploads`' protocol, with the state
and the chunks in the database, so consecutive chunks may land on different replicas.

Each chunk is applied in one transaction that locks the upload's row (`FOR UPDATE`), so two
replicas receiving chunks of one upload agree on the next index. The final chunk's mark is the
row's `finalizing` column; completing streams the chunks into a local temp file, which the
context store then takes over.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import StoreSettings
from rlm_mcp.store.index import Row
from rlm_mcp.store.pg.contexts import PgContextIndex, PgContextStore, PgTx
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.reads import read_chunks
from rlm_mcp.store.statements import POSTGRES
from rlm_mcp.store.upload_model import unknown_upload
from rlm_mcp.store.uploads import Uploads

__all__ = ["PgUploadIndex", "PgUploadStore"]


class PgUploadTx(PgTx):
    async def expire(self, cutoff: float) -> None:
        await self.execute(POSTGRES.expire_uploads, (cutoff,))  # their chunks go with them (cascade)

    async def add_chunk(self, upload_id: str, index: int, staged: Any) -> None:
        await self.execute("INSERT INTO rlm_upload_chunks VALUES (%s, %s, %b)", (upload_id, index, staged))

    async def is_finalizing(self, row: Row) -> bool:
        return bool(row["finalizing"])

    async def set_finalizing(self, upload_id: str) -> None:
        await self.execute("UPDATE rlm_uploads SET finalizing = true WHERE upload_id = %s AND NOT done", (upload_id,))


class PgUploadIndex:
    sql = POSTGRES

    def __init__(self, contexts: PgContextIndex, db: Database) -> None:
        self._contexts = contexts
        self._db = db

    @asynccontextmanager
    async def read(self) -> AsyncIterator[PgUploadTx]:
        async with self._db.connection() as conn:
            yield PgUploadTx(conn)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[PgUploadTx]:
        async with self._db.clocked_transaction() as (conn, now):
            yield PgUploadTx(conn, now)

    async def stage(self, data: bytes) -> bytes:
        return data  # sent with the chunk's insert

    async def discard(self, staged: Any) -> None:
        return None

    async def clear_finalizing(self, upload_id: str) -> None:
        async with self._db.connection() as conn:
            await conn.execute("UPDATE rlm_uploads SET finalizing = false WHERE upload_id = %s", (upload_id,))

    @asynccontextmanager
    async def assembled(self, upload_id: str, count: int) -> AsyncIterator[Iterable[bytes] | Path]:
        await anyio.to_thread.run_sync(self._contexts.prepare)
        fd, name = tempfile.mkstemp(dir=self._contexts.tmp_dir, prefix="upload-", suffix=".tmp")
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                async with self._db.connection() as conn:
                    async for data in read_chunks(
                        conn,
                        "SELECT data FROM rlm_upload_chunks WHERE upload_id = %s AND idx = %s",
                        upload_id,
                        count,
                        missing=lambda: unknown_upload(upload_id),
                    ):
                        await anyio.to_thread.run_sync(out.write, data)
            yield tmp
        finally:
            await anyio.Path(tmp).unlink(missing_ok=True)

    async def finished(self, upload_id: str) -> None:
        async with self._db.connection() as conn:
            await conn.execute("DELETE FROM rlm_upload_chunks WHERE upload_id = %s", (upload_id,))


class PgUploadStore(Uploads):
    def __init__(self, settings: StoreSettings, contexts: PgContextStore, db: Database) -> None:
        super().__init__(settings, contexts, PgUploadIndex(contexts.rows, db))
