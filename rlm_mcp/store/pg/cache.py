"""This replica's local copy of context bytes, content-addressed: `data_dir/cache/<sha[:2]>/<sha>`.

The bytes live in PostgreSQL's rows or a bucket (a `store.ports.BlobPort`); a run streams a context to its sandbox from a local file, so one in use
is fetched here first (streamed chunk by chunk, checked against its sha256, renamed into place).
A file whose blob is no longer in the database (deleted or evicted on any replica) is removed by
`sweep`, which runs at each heartbeat and after every delete or eviction on this replica; with a
bound (RLM_MCP_CACHE_MAX_BYTES) it also removes the least recently used files no run of this
replica pins until the cache fits (a use touches its file's time).
Cached files are private (0600 in a 0700 data dir: `rlm_mcp.store.private`), as the file store's
blobs are: a sandbox receives the bytes over its stream, never by a mount.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import anyio

from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.ports import BlobPort
from rlm_mcp.store.private import PRIVATE_FILE, private_dir

log = logging.getLogger("rlm_mcp.store")


class BlobCache:
    def __init__(self, root: Path, tmp_dir: Path, max_bytes: int | None = None) -> None:
        self.root = root
        self.tmp_dir = tmp_dir
        self.max_bytes = max_bytes
        self._locks: dict[str, anyio.Lock] = {}

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def has(self, sha256: str, size: int) -> bool:
        try:
            return self.path(sha256).stat().st_size == size
        except FileNotFoundError:
            return False

    def touch(self, sha256: str, size: int) -> bool:
        """Whether the blob's file is here whole; if so its time is set to now (used now: the
        last to go past the bound). One worker-thread hop for both."""
        if not self.has(sha256, size):
            return False
        try:
            os.utime(self.path(sha256))
        except FileNotFoundError:  # swept meanwhile: fetched again
            return False
        return True

    def prepare(self) -> None:
        """The data dir private (0700, also when made beforehand) and its temp folder made:
        cached contexts are users' documents, as the file store's blobs are."""
        private_dir(self.root.parent)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def adopt(self, tmp_path: Path, sha256: str) -> None:
        """Move a verified temp file (same filesystem) into the cache."""
        target = self.path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp_path, PRIVATE_FILE)  # a sandbox gets the bytes over its stream, never by a mount
        os.replace(tmp_path, target)

    def copy_in(self, source: Path, sha256: str) -> None:
        """Copy a file the caller keeps (a user's file) into the cache."""
        self.prepare()
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="cache-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                while block := src.read(1 << 20):
                    out.write(block)
            self.adopt(Path(name), sha256)
        finally:
            Path(name).unlink(missing_ok=True)

    async def fetch(self, blobs: BlobPort, sha256: str, size: int) -> Path:
        """The local file of a blob, streamed from where `blobs` keeps it when this replica
        lacks it, checked against its digest before it is renamed into place.

        A file already here (every run but a context's first on this replica) is found and
        touched in one worker-thread hop, without the per-blob lock: the lock only keeps two
        fetches of one blob from streaming it twice, and a file that is here whole is never
        rewritten (its name is its digest)."""
        target = self.path(sha256)
        if await anyio.to_thread.run_sync(self.touch, sha256, size):
            return target
        lock = self._locks.setdefault(sha256, anyio.Lock())
        async with lock:
            if await anyio.to_thread.run_sync(self.touch, sha256, size):  # fetched while this waited
                return target
            await anyio.to_thread.run_sync(self.prepare)
            fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="fetch-", suffix=".tmp")
            tmp = Path(name)
            digest = hashlib.sha256()
            try:
                with os.fdopen(fd, "wb") as out:
                    async for block in blobs.read(sha256):
                        digest.update(block)
                        await anyio.to_thread.run_sync(out.write, block)
                if digest.hexdigest() != sha256:
                    raise RuntimeError(f"blob {sha256} read back from {blobs.where} with another digest")
                await anyio.to_thread.run_sync(self.adopt, tmp, sha256)
            finally:
                await anyio.Path(tmp).unlink(missing_ok=True)
            log.info("fetched blob %s (%d bytes) into the local cache", sha256[:12], size)
            return target

    def cached(self) -> list[str]:
        found: list[str] = []
        try:
            for sub in os.scandir(self.root):
                if sub.is_dir(follow_symlinks=False):
                    found += [e.name for e in os.scandir(sub.path) if len(e.name) == 64]
        except FileNotFoundError:
            pass
        return found

    def drop(self, shas: Iterable[str]) -> None:
        for sha in shas:
            self.path(sha).unlink(missing_ok=True)

    async def sweep(self, db: Database) -> list[str]:
        """Remove cached files whose blob the database no longer has; returns their digests."""
        local = await anyio.to_thread.run_sync(self.cached)
        if not local:
            return []
        async with db.connection() as conn:
            cur = await conn.execute("SELECT sha256 FROM rlm_blobs WHERE sha256 = ANY(%s)", (local,))
            known = {r["sha256"] for r in await cur.fetchall()}
        gone = [sha for sha in local if sha not in known]
        if gone:
            await anyio.to_thread.run_sync(self.drop, gone)
            log.info("removed %d cached blob(s) deleted elsewhere", len(gone))
        if self.max_bytes is not None:
            kept = [sha for sha in local if sha in known]
            async with db.connection() as conn:
                cur = await conn.execute(
                    "SELECT DISTINCT c.sha256 FROM rlm_pins p JOIN rlm_contexts c ON c.context_id = p.context_id "
                    "WHERE p.replica_id = %s",
                    (db.replica_id,),
                )
                pinned = {r["sha256"] for r in await cur.fetchall()}
            over = await anyio.to_thread.run_sync(self._over_bound, kept, pinned, self.max_bytes)
            if over:
                log.info("removed %d cached blob(s) past RLM_MCP_CACHE_MAX_BYTES", len(over))
            gone += over
        return gone

    def _over_bound(self, shas: list[str], pinned: set[str], bound: int) -> list[str]:
        """Remove the least recently used unpinned files until the cache fits `bound`."""
        sized: list[tuple[float, int, str]] = []
        for sha in shas:
            try:
                st = self.path(sha).stat()
            except FileNotFoundError:
                continue
            sized.append((st.st_mtime, st.st_size, sha))
        total = sum(size for _, size, _ in sized)
        removed: list[str] = []
        for _, size, sha in sorted(sized):
            if total <= bound:
                break
            if sha in pinned:
                continue
            self.path(sha).unlink(missing_ok=True)
            total -= size
            removed.append(sha)
        return removed
