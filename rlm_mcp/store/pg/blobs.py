"""A blob's rows in PostgreSQL: one copy per owner that holds it.

A content's bytes are `rlm_blob_chunks` rows (1 MiB each) under its sha256. Each owner that
holds the content has a copy of its own: copy k holds chunk i at index `k * COPY_STRIDE + i`.
Copy 0, written by the first owner to store the content, is the one every replica reads; a
load by an owner that does not hold the content yet writes one more copy, so it costs what a
load of new bytes costs, and its speed never tells one token that another stored the same bytes
(deduplication is within an owner only). When an owner lets go of a content that others still
hold, the copies beyond the number of holders are removed (`release`), so the database holds a
content at most once per holder: each owner's bytes there stay within its share of the store.

`RowBlobs` is this as the store's `BlobPort` (the default); `bucket_blobs.BucketBlobs` keeps
the bytes in a bucket instead and reads these rows while a moved team's blobs are not moved yet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from rlm_mcp.errors import UnknownIdError
from rlm_mcp.owners import Owner
from rlm_mcp.store._ingest import CHUNK, Ingested
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.reads import read_chunks

__all__ = ["COPY_STRIDE", "RowBlobs", "add_copy", "deleted", "owner_holds", "release", "write_copy"]

COPY_STRIDE = 1 << 20  # chunk indexes per copy (1 TiB of 1 MiB chunks): copy k starts at k * COPY_STRIDE
_MAX_COPIES = (2**31 - 1) // COPY_STRIDE  # the chunk index is a PostgreSQL integer

Conn = Any  # psycopg.AsyncConnection[dict[str, Any]], as pg/db.py's Conn


async def owner_holds(conn: Conn, owner: Owner, sha256: str) -> bool:
    """Whether `owner` holds a context of these bytes (in any format)."""
    cur = await conn.execute(
        "SELECT 1 FROM rlm_context_owners o JOIN rlm_contexts c ON c.context_id = o.context_id "
        "WHERE o.owner = %s AND c.sha256 = %s LIMIT 1",
        (owner, sha256),
    )
    return await cur.fetchone() is not None


async def write_copy(conn: Conn, ing: Ingested, chunks: int, copy: int) -> None:
    """Stream the blob's chunks from its temp file in as copy `copy` (%b: bytea sent binary)."""
    base = copy * COPY_STRIDE
    fh = await anyio.to_thread.run_sync(open, ing.tmp_path, "rb")
    try:
        for idx in range(chunks):
            block = await anyio.to_thread.run_sync(fh.read, CHUNK)
            await conn.execute("INSERT INTO rlm_blob_chunks VALUES (%s, %s, %b)", (ing.sha256, base + idx, block))
    finally:
        await anyio.to_thread.run_sync(fh.close)


async def add_copy(conn: Conn, ing: Ingested, chunks: int) -> None:
    """Write one more copy of a stored blob (for an owner that does not hold it yet). Copies of
    one blob are added one at a time (a lock on its row), each after the highest present. A blob
    too large for a copy's index range (over 1 TiB) keeps its one copy."""
    if chunks > COPY_STRIDE:
        return
    await conn.execute("SELECT 1 FROM rlm_blobs WHERE sha256 = %s FOR UPDATE", (ing.sha256,))
    cur = await conn.execute(
        "SELECT COALESCE(MAX(idx), -1) AS top FROM rlm_blob_chunks WHERE sha256 = %s", (ing.sha256,)
    )
    row = await cur.fetchone()
    copy = int(row["top"]) // COPY_STRIDE + 1 if row is not None else 1
    if copy <= _MAX_COPIES:
        await write_copy(conn, ing, chunks, copy)


async def release(conn: Conn, sha256: str) -> bool:
    """After an owner let go of a content (or a context of it went): remove the blob when no
    context uses it (True), else the copies beyond one per remaining holder (False)."""
    cur = await conn.execute(
        "DELETE FROM rlm_blobs b WHERE b.sha256 = %s AND NOT EXISTS "
        "(SELECT 1 FROM rlm_contexts c WHERE c.sha256 = b.sha256) RETURNING sha256",
        (sha256,),
    )
    if await cur.fetchone() is not None:
        return True
    await conn.execute(
        "DELETE FROM rlm_blob_chunks WHERE sha256 = %s AND idx >= %s * (SELECT GREATEST(1, COUNT(DISTINCT o.owner)) "
        "FROM rlm_context_owners o JOIN rlm_contexts c ON c.context_id = o.context_id WHERE c.sha256 = %s)",
        (sha256, COPY_STRIDE, sha256),
    )
    return False


def deleted(sha256: str) -> UnknownIdError:
    """A blob whose row or bytes went away while a replica fetched it."""
    return UnknownIdError("context", sha256[:24], detail=" (its bytes were deleted)")


async def row_chunks(db: Database, sha256: str) -> AsyncIterator[bytes]:
    """Copy 0 of a blob's rows, a chunk at a time; `deleted` when it is gone."""
    async with db.connection() as conn:
        cur = await conn.execute("SELECT chunks FROM rlm_blobs WHERE sha256 = %s", (sha256,))
        row = await cur.fetchone()
        if row is None:
            raise deleted(sha256)
        async for block in read_chunks(
            conn,
            "SELECT data FROM rlm_blob_chunks WHERE sha256 = %s AND idx = %s",
            sha256,
            int(row["chunks"]),
            missing=lambda: deleted(sha256),
        ):
            yield block


class RowBlobs:
    """The bytes as rows of `rlm_blob_chunks` (`store.ports.BlobPort`)."""

    where = "the database"

    def __init__(self, db: Database) -> None:
        self._db = db

    async def put(self, conn: Conn, ing: Ingested, owner: Owner, *, new: bool) -> None:
        # New content is streamed in (another writer waits on the key). An owner that does not
        # hold these bytes yet writes a copy of its own: a load costs the same whether or not
        # another token stored them (else its speed would tell).
        chunks = -(-ing.bytes // CHUNK)
        if new:
            await write_copy(conn, ing, chunks, 0)
        elif not await owner_holds(conn, owner, ing.sha256):
            await add_copy(conn, ing, chunks)

    async def release(self, conn: Conn, sha256: str) -> tuple[bool, list[str]]:
        return await release(conn, sha256), []

    def read(self, sha256: str) -> AsyncIterator[bytes]:
        return row_chunks(self._db, sha256)

    async def purge(self, keys: Sequence[str]) -> None:
        return None
