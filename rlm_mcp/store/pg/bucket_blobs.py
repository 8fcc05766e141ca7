"""Contexts' bytes in an S3 bucket, indexed in PostgreSQL (`store.ports.BlobPort`; RLM_MCP_BLOB_URL).

Keys: `c/<owner key>/<sha256[:2]>/<sha256>.<random>`. The owner key is random, made once per
owner and kept in `rlm_blob_owner_keys`, so a key reveals no token nor a token's hash. Each owner
holding a content has an object of its own (as each has its own copy of the rows): a load costs
a full upload whether or not another owner stored the same bytes, so its speed tells nothing.

Nothing is lost and nothing leaks (`rlm_objects`, times by the database's clock):
1. an `intent` row is committed, on a connection of its own, before the object is written;
2. the object is uploaded from the ingested temp file, streamed (multipart);
3. in the context's own transaction the row becomes `live`; a sweep that took the intent meanwhile
   makes this fail and the transaction roll back, so no context names a missing object.
A front killed between 1 and 3 leaves an intent row: the sweep (`sweep`) removes its object
after RLM_MCP_BLOB_GRACE_S; killed mid-upload, it also leaves an incomplete multipart upload, which
the sweep aborts once it is older than the grace period by the bucket's clock. A release marks the objects no owner holds any more `doomed` in the
releasing transaction; they are removed right after its commit (`purge`), or by the next sweep.
A content whose `rlm_blobs` row still counts chunks (stored before the bucket, not moved yet:
`rlm-mcp blobs move`) is read from the rows.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence

from rlm_mcp.config.blobs import BlobSettings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.owners import Owner
from rlm_mcp.store._ingest import Ingested
from rlm_mcp.store.bucket import Bucket, BucketError, BucketObjectMissing
from rlm_mcp.store.pg import blobs as rows
from rlm_mcp.store.pg.db import Conn, Database

__all__ = ["BucketBlobs", "owner_key"]

log = logging.getLogger("rlm_mcp.store")

SWEEP_BATCH = 200


async def owner_key(conn: Conn, owner: str) -> str:
    """The owner's random key (made by whichever replica asks first)."""
    await conn.execute(
        "INSERT INTO rlm_blob_owner_keys VALUES (%s, %s) ON CONFLICT (owner) DO NOTHING", (owner, secrets.token_hex(12))
    )
    cur = await conn.execute("SELECT key FROM rlm_blob_owner_keys WHERE owner = %s", (owner,))
    row = await cur.fetchone()
    assert row is not None  # inserted above unless it was there
    return str(row["key"])


class BucketBlobs:
    """Context bytes as objects of one bucket, one per holding owner."""

    def __init__(self, db: Database, bucket: Bucket, settings: BlobSettings) -> None:
        self._db = db
        self.bucket = bucket
        self.where = bucket.url
        self._grace_s = settings.blob_grace_s
        self._interval_s = settings.blob_sweep_interval_s
        self._last_sweep = float("-inf")

    # --- writing ---------------------------------------------------------------------------

    async def put(self, conn: Conn, ing: Ingested, owner: Owner, *, new: bool) -> None:
        cur = await conn.execute(
            "SELECT 1 FROM rlm_objects WHERE sha256 = %s AND owner = %s AND state = 'live' LIMIT 1", (ing.sha256, owner)
        )
        if await cur.fetchone() is not None:
            return  # this owner holds the bytes already (deduplication within an owner)
        key = await self.intend(owner=owner, sha256=ing.sha256, size=ing.bytes)
        await self.bucket.put_file(key, ing.tmp_path)
        await self.make_live(conn, key)

    async def intend(
        self, *, owner: str | None = None, sha256: str | None = None, session_id: str | None = None, size: int = 0
    ) -> str:
        """Commit the intent row of a new object (before the object exists); its key."""
        async with self._db.connection() as side:  # autocommit: the intent outlives a rollback
            if sha256 is not None and owner is not None:
                key = f"c/{await owner_key(side, owner)}/{sha256[:2]}/{sha256}.{secrets.token_hex(6)}"
            else:
                key = f"s/{secrets.token_hex(16)}"
            await side.execute(
                "INSERT INTO rlm_objects (key, state, sha256, owner, session_id, bytes, created_at) "
                "VALUES (%s, 'intent', %s, %s, %s, %s, extract(epoch FROM now()))",
                (key, sha256, owner, session_id, size),
            )
        return key

    async def make_live(self, conn: Conn, key: str) -> None:
        """In the transaction that commits what uses the object: its intent becomes live."""
        cur = await conn.execute(
            "UPDATE rlm_objects SET state = 'live' WHERE key = %s AND state = 'intent' RETURNING key", (key,)
        )
        if await cur.fetchone() is None:
            raise BucketError(
                f"The upload to the bucket {self.where} took longer than RLM_MCP_BLOB_GRACE_S: its object was swept.",
                "Raise RLM_MCP_BLOB_GRACE_S above the slowest upload's time, then load the context again.",
            )

    # --- releasing -------------------------------------------------------------------------

    async def release(self, conn: Conn, sha256: str) -> tuple[bool, list[str]]:
        gone = await rows.release(conn, sha256)  # the content's row (and any rows not moved yet)
        if gone:
            cur = await conn.execute(
                "UPDATE rlm_objects SET state = 'doomed', created_at = extract(epoch FROM now()) "
                "WHERE sha256 = %s AND state = 'live' RETURNING key",
                (sha256,),
            )
        else:
            # The objects of owners who no longer hold the content; one stays while a context
            # (pinned, its owners gone) still uses it.
            cur = await conn.execute(
                "UPDATE rlm_objects o SET state = 'doomed', created_at = extract(epoch FROM now()) "
                "WHERE o.sha256 = %(sha)s AND o.state = 'live' AND NOT EXISTS (SELECT 1 FROM rlm_context_owners co "
                "  JOIN rlm_contexts c ON c.context_id = co.context_id WHERE c.sha256 = o.sha256 AND co.owner = o.owner) "
                "AND (EXISTS (SELECT 1 FROM rlm_context_owners co JOIN rlm_contexts c ON c.context_id = co.context_id "
                "  WHERE c.sha256 = %(sha)s) "
                "  OR o.key <> (SELECT min(k.key) FROM rlm_objects k WHERE k.sha256 = %(sha)s AND k.state = 'live')) "
                "RETURNING o.key",
                {"sha": sha256},
            )
        return gone, [r["key"] for r in await cur.fetchall()]

    async def purge(self, keys: Sequence[str]) -> None:
        for key in keys:
            try:
                await self.bucket.delete(key)
            except BucketError as exc:
                log.warning("%s The sweep retries it.", exc.cause)
                continue
            async with self._db.connection() as conn:
                await conn.execute("DELETE FROM rlm_objects WHERE key = %s AND state = 'doomed'", (key,))

    # --- reading ---------------------------------------------------------------------------

    async def read(self, sha256: str) -> AsyncIterator[bytes]:
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT chunks FROM rlm_blobs WHERE sha256 = %s", (sha256,))
            blob = await cur.fetchone()
            if blob is None:
                raise rows.deleted(sha256)
            cur = await conn.execute(
                "SELECT key FROM rlm_objects WHERE sha256 = %s AND state = 'live' ORDER BY key LIMIT 1", (sha256,)
            )
            found = await cur.fetchone()
        if found is None:
            if int(blob["chunks"]) > 0:  # stored before the bucket and not moved yet
                async for block in rows.row_chunks(self._db, sha256):
                    yield block
                return
            raise rows.deleted(sha256)
        try:
            async for piece in self.bucket.read(str(found["key"])):
                yield piece
        except BucketObjectMissing:
            raise rows.deleted(sha256) from None

    # --- the sweep -------------------------------------------------------------------------

    async def maybe_sweep(self) -> None:
        """At a replica's heartbeat: sweep when RLM_MCP_BLOB_SWEEP_INTERVAL_S has passed."""
        if time.monotonic() - self._last_sweep < self._interval_s:
            return
        self._last_sweep = time.monotonic()
        try:
            await self.sweep()
        except RlmMcpError as exc:
            log.warning("the bucket sweep failed: %s", exc)

    async def sweep(self) -> int:
        """Remove the objects of doomed rows and of intent rows older than the grace period (by
        the database's clock), then their rows; how many went. Replicas sweeping together
        take different rows (SKIP LOCKED). Then abort the abandoned multipart uploads."""
        removed = 0
        while True:
            async with self._db.transaction() as conn:
                cur = await conn.execute(
                    "SELECT key FROM rlm_objects WHERE state = 'doomed' OR (state = 'intent' "
                    "AND created_at < extract(epoch FROM now()) - %s) ORDER BY created_at LIMIT %s FOR UPDATE SKIP LOCKED",
                    (self._grace_s, SWEEP_BATCH),
                )
                keys = [str(r["key"]) for r in await cur.fetchall()]
                for key in keys:
                    await self.bucket.delete(key)
                if keys:
                    await conn.execute("DELETE FROM rlm_objects WHERE key = ANY(%s)", (keys,))
            removed += len(keys)
            if len(keys) < SWEEP_BATCH:
                break
        if removed:
            log.info("removed %d object(s) from the bucket %s that nothing refers to", removed, self.where)
        await self._abort_abandoned_uploads()
        return removed

    async def _abort_abandoned_uploads(self) -> None:
        """The multipart uploads a killed front left: janitor work whose failure is logged and
        never fails the sweep of rows (the bucket's lifecycle rule is the second line)."""
        try:
            await self.bucket.abort_abandoned_uploads(self._grace_s)
        except RlmMcpError as exc:
            log.warning("the bucket sweep could not abort abandoned multipart uploads: %s", exc)

    async def orphans(self) -> list[str]:
        """Keys in the bucket that no row names (what the sweep would leave: none, if the rules hold)."""
        keys = set(await self.bucket.keys("c")) | set(await self.bucket.keys("s"))
        if not keys:
            return []
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT key FROM rlm_objects WHERE key = ANY(%s)", (list(keys),))
            known = {str(r["key"]) for r in await cur.fetchall()}
        return sorted(keys - known)
