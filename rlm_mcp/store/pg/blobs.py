"""A blob's rows in PostgreSQL: one copy per owner that holds it.

A content's bytes are `rlm_blob_chunks` rows (1 MiB each) under its sha256. Each owner that
holds the content has a copy of its own: copy k holds chunk i at index `k * COPY_STRIDE + i`.
Copy 0, written by the first owner to store the content, is the one every replica reads; a
load by an owner that does not hold the content yet writes one more copy, so it costs what a
load of new bytes costs, and its speed never tells one token that another stored the same bytes
(deduplication is within an owner only). When an owner lets go of a content that others still
hold, the copies beyond the number of holders are removed (`release`), so the database holds a
content at most once per holder: each owner's bytes there stay within its share of the store.
"""

from __future__ import annotations

from typing import Any

import anyio

from rlm_mcp.owners import Owner
from rlm_mcp.store._ingest import CHUNK, Ingested

__all__ = ["COPY_STRIDE", "add_copy", "owner_holds", "release", "write_copy"]

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
