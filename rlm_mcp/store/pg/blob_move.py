"""Moving a team's bytes from the database's rows to the bucket (`rlm-mcp blobs move`), while the
team serves.

Per content still in rows (`rlm_blobs.chunks > 0`): each owner holding it gets its object
(intent row, the rows streamed up a chunk at a time, live in a transaction that first locks the
content's row, so a content deleted meanwhile leaves only an intent for the sweep); then, in one
transaction, the content's chunk rows go and its row says 0 chunks. Per snapshot still in rows:
the same, checked against the session's snapshot generation (a newer snapshot stored meanwhile
wins, and the moved copy is left to the sweep). Replicas read a content from its object once one
is live, from the rows until then (`bucket_blobs.BucketBlobs.read`), so runs never wait for the
move. Interrupted, it resumes where it stopped: what is moved is not in rows any more. The space
the rows held is given back to the operating system only by `VACUUM FULL` or `pg_repack`
(docs/object-storage.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from rlm_mcp.store.pg.blobs import row_chunks
from rlm_mcp.store.pg.bucket_blobs import BucketBlobs
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.reads import read_chunks

__all__ = ["MovePlan", "move", "plan"]

_HOLDERS = (
    "SELECT DISTINCT co.owner FROM rlm_context_owners co JOIN rlm_contexts c ON c.context_id = co.context_id "
    "WHERE c.sha256 = %s ORDER BY co.owner"
)


@dataclass
class MovePlan:
    contents: int = 0  # contents still in rows
    content_bytes: int = 0  # what their objects will hold (once per holding owner)
    snapshots: int = 0
    snapshot_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.content_bytes + self.snapshot_bytes


async def plan(db: Database) -> MovePlan:
    """What a move would upload now (the dry run); reads only."""
    found = MovePlan()
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, coalesce(sum(b.bytes * GREATEST(1, (SELECT count(DISTINCT co.owner) "
            "FROM rlm_context_owners co JOIN rlm_contexts c ON c.context_id = co.context_id "
            "WHERE c.sha256 = b.sha256))), 0) AS bytes FROM rlm_blobs b WHERE b.chunks > 0"
        )
        row = await cur.fetchone()
        if row is not None:
            found.contents, found.content_bytes = int(row["n"]), int(row["bytes"])
        cur = await conn.execute(
            "SELECT count(*) AS n, coalesce(sum(s.snapshot_bytes), 0) AS bytes FROM rlm_sessions s "
            "WHERE s.snapshot_gen IS NOT NULL AND EXISTS (SELECT 1 FROM rlm_session_snapshots r WHERE r.session_id = s.session_id)"
        )
        row = await cur.fetchone()
        if row is not None:
            found.snapshots, found.snapshot_bytes = int(row["n"]), int(row["bytes"])
    return found


async def move(db: Database, bucket: BucketBlobs, advance: Callable[[int], None]) -> MovePlan:
    """Move every content and snapshot still in rows; `advance(n)` after each n bytes uploaded.
    What was moved."""
    moved = MovePlan()
    async with db.connection() as conn:
        cur = await conn.execute("SELECT sha256, bytes FROM rlm_blobs WHERE chunks > 0 ORDER BY sha256")
        contents = [(str(r["sha256"]), int(r["bytes"])) for r in await cur.fetchall()]
    for sha256, size in contents:
        if await _move_content(db, bucket, sha256, size, advance):
            moved.contents += 1
            moved.content_bytes += size
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT session_id, snapshot_gen, snapshot_bytes FROM rlm_sessions s WHERE s.snapshot_gen IS NOT NULL "
            "AND EXISTS (SELECT 1 FROM rlm_session_snapshots r WHERE r.session_id = s.session_id) ORDER BY session_id"
        )
        snapshots = [
            (str(r["session_id"]), int(r["snapshot_gen"]), int(r["snapshot_bytes"] or 0)) for r in await cur.fetchall()
        ]
    for session_id, generation, size in snapshots:
        if await _move_snapshot(db, bucket, session_id, generation, size, advance):
            moved.snapshots += 1
            moved.snapshot_bytes += size
    return moved


async def _counted(pieces: AsyncIterator[bytes], advance: Callable[[int], None]) -> AsyncIterator[bytes]:
    async for piece in pieces:
        yield piece
        advance(len(piece))


async def _move_content(
    db: Database, bucket: BucketBlobs, sha256: str, size: int, advance: Callable[[int], None]
) -> bool:
    async with db.connection() as conn:
        cur = await conn.execute(_HOLDERS, (sha256,))
        holders = [str(r["owner"]) for r in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT DISTINCT owner FROM rlm_objects WHERE sha256 = %s AND state = 'live'", (sha256,)
        )
        done = {str(r["owner"]) for r in await cur.fetchall()}
    if not holders:
        return False  # no owner holds it (a pinned orphan): it goes at the next eviction
    for owner in holders:
        if owner in done:
            continue
        key = await bucket.intend(owner=owner, sha256=sha256, size=size)
        await bucket.bucket.put_stream(key, _counted(row_chunks(db, sha256), advance))
        async with db.transaction() as conn:
            cur = await conn.execute("SELECT 1 FROM rlm_blobs WHERE sha256 = %s FOR UPDATE", (sha256,))
            if await cur.fetchone() is None:
                return False  # deleted meanwhile: the intent is the sweep's
            await bucket.make_live(conn, key)
    async with db.transaction() as conn:
        await conn.execute("SELECT 1 FROM rlm_blobs WHERE sha256 = %s FOR UPDATE", (sha256,))
        await conn.execute("DELETE FROM rlm_blob_chunks WHERE sha256 = %s", (sha256,))
        await conn.execute("UPDATE rlm_blobs SET chunks = 0 WHERE sha256 = %s", (sha256,))
    return True


async def _snapshot_rows(db: Database, session_id: str) -> AsyncIterator[bytes]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM rlm_session_snapshots WHERE session_id = %s", (session_id,))
        row = await cur.fetchone()
        async for data in read_chunks(
            conn,
            "SELECT data FROM rlm_session_snapshots WHERE session_id = %s AND idx = %s",
            session_id,
            int(row["n"]) if row is not None else 0,
        ):
            yield data


async def _move_snapshot(
    db: Database, bucket: BucketBlobs, session_id: str, generation: int, size: int, advance: Callable[[int], None]
) -> bool:
    key = await bucket.intend(session_id=session_id, size=size)
    await bucket.bucket.put_stream(key, _counted(_snapshot_rows(db, session_id), advance))
    async with db.transaction() as conn:
        cur = await conn.execute(
            "SELECT snapshot_gen FROM rlm_sessions WHERE session_id = %s AND state = 'open' FOR UPDATE", (session_id,)
        )
        row = await cur.fetchone()
        if row is None or row["snapshot_gen"] != generation:
            return False  # ended, or a newer snapshot was stored meanwhile: the intent is the sweep's
        cur = await conn.execute("SELECT 1 FROM rlm_session_snapshots WHERE session_id = %s LIMIT 1", (session_id,))
        if await cur.fetchone() is None:
            return False
        await bucket.make_live(conn, key)
        await conn.execute("DELETE FROM rlm_session_snapshots WHERE session_id = %s", (session_id,))
    return True
