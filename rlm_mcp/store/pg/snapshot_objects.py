"""Kept sessions' snapshots as objects of the bucket (RLM_MCP_BLOB_URL), for `sessions.PgSessionStore`.

The same accounting as contexts' objects (`bucket_blobs`): the intent row is committed before
the object is written, the row becomes `live` in the transaction that records the snapshot on
its session, and the snapshot it replaces (or a closed or expired session's) is `doomed` there
and removed after the commit, or by the sweep. Snapshots go up from the worker's file and come
down into one streamed: never whole in memory. A session whose snapshot is still rows (stored
before the bucket, not moved yet) is read from the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio

from rlm_mcp.store.pg.bucket_blobs import BucketBlobs
from rlm_mcp.store.pg.db import Conn

__all__ = ["doom", "live_key", "read_bytes", "read_into", "store"]

_DOOM = (
    "UPDATE rlm_objects SET state = 'doomed', created_at = extract(epoch FROM now()) "
    "WHERE session_id = ANY(%s) AND state = 'live' AND key <> %s RETURNING key"
)


async def store(bucket: BucketBlobs, conn: Conn, session_id: str, blob: bytes | Path, size: int) -> list[str]:
    """Write the snapshot's object and make it the session's live one, in `conn`'s transaction;
    the keys of the objects it replaces (remove them after the commit)."""
    key = await bucket.intend(session_id=session_id, size=size)
    if isinstance(blob, bytes):
        await bucket.bucket.put_bytes(key, blob)
    else:
        await bucket.bucket.put_file(key, blob)
    await bucket.make_live(conn, key)
    cur = await conn.execute(_DOOM, ([session_id], key))
    return [str(r["key"]) for r in await cur.fetchall()]


async def doom(conn: Conn, session_ids: list[str]) -> list[str]:
    """The sessions ended: their snapshots' objects go once the transaction committed."""
    cur = await conn.execute(_DOOM, (session_ids, ""))
    return [str(r["key"]) for r in await cur.fetchall()]


async def live_key(conn: Conn, session_id: str) -> str | None:
    cur = await conn.execute(
        "SELECT key FROM rlm_objects WHERE session_id = %s AND state = 'live' ORDER BY created_at DESC LIMIT 1",
        (session_id,),
    )
    row = await cur.fetchone()
    return None if row is None else str(row["key"])


async def read_into(bucket: BucketBlobs, key: str, path: Path, opener: Callable[[str, int], int]) -> int:
    """Stream the object into `path` (opened by `opener`: a private file); its size."""
    size = 0
    async with await anyio.open_file(path, "wb", opener=opener) as out:
        async for piece in bucket.bucket.read(key):
            await out.write(piece)
            size += len(piece)
    return size


async def read_bytes(bucket: BucketBlobs, key: str) -> bytes:
    return b"".join([piece async for piece in bucket.bucket.read(key)])
