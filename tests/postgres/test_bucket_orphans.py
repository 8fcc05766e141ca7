"""Orphans in the bucket: a front SIGKILLed mid-upload, or between its upload and its commit, leaves
an intent row only, which the sweep removes with its object (no key in the bucket without a row
after it); a worker SIGKILLed mid-fetch leaves no object, row or cached file and fetches again; a
replica sweeps at its heartbeat once the grace period has passed. Real SeaweedFS and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.owners import Owner
from rlm_mcp.store.pg import bucket_of
from rlm_mcp.store.pg.contexts import PgContextStore
from tests.fixtures_bucket import bucket_settings, object_rows

pytestmark = pytest.mark.anyio


_KILLED_FRONT = textwrap.dedent(
    """
    import asyncio, sys
    from rlm_mcp.config import Settings
    from rlm_mcp.owners import Owner
    from rlm_mcp.assembly import make_stores
    from rlm_mcp.store.pg.bucket_blobs import BucketBlobs

    async def stall(self, conn, key):
        print("uploaded", key, flush=True)
        await asyncio.sleep(3600)  # killed here: the object is in the bucket, its row still an intent

    BucketBlobs.make_live = stall

    async def main():
        settings = Settings(database_url=sys.argv[1], blob_url=sys.argv[2], data_dir=sys.argv[3])
        async with make_stores(settings) as stores:
            await stores.contexts.put_bytes(b"x" * (12 << 20), name="big", format="text", source={}, owner=Owner("alice"))

    asyncio.run(main())
    """
)


def _killed_after_its_first_line(script: str, *args: str) -> str:
    """Run `script` in a fresh interpreter, read the first line it prints (blocking until then),
    and SIGKILL it there, as a host dies: no cleanup of its own runs."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        assert proc.stdout is not None
        return proc.stdout.readline().decode()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


async def test_a_front_killed_between_upload_and_commit_leaves_nothing_after_the_sweep(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    # The line comes once the object is written.
    line = _killed_after_its_first_line(_KILLED_FRONT, pg_migrated_url, bucket_url, str(tmp_path / "front"))
    assert line.startswith("uploaded "), line
    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url, blob_grace_s=0.001)) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None
        key = line.split()[1]
        assert await bucket.bucket.keys("c") == [key] and await object_rows(stores.lifecycle) == [(key, "intent")]
        assert await stores.contexts.list(owner=Owner("alice")) == []  # no context names it
        assert await bucket.sweep() == 1
        assert await bucket.bucket.keys("c") == [] and await object_rows(stores.lifecycle) == []
        assert await bucket.orphans() == []


_KILLED_MID_UPLOAD = textwrap.dedent(
    """
    import asyncio, sys
    from rlm_mcp.config import Settings
    from rlm_mcp.owners import Owner
    from rlm_mcp.store.bucket import Bucket
    from rlm_mcp.assembly import make_stores

    async def stalling_put(self, key, path):
        async def parts():
            with open(path, "rb") as fh:
                yield fh.read(9 << 20)  # more than one multipart part: the upload has begun
            print("uploading", key, flush=True)
            await asyncio.sleep(3600)  # killed here, mid-upload
        await self.put_stream(key, parts())

    Bucket.put_file = stalling_put

    async def main():
        settings = Settings(database_url=sys.argv[1], blob_url=sys.argv[2], data_dir=sys.argv[3])
        async with make_stores(settings) as stores:
            await stores.contexts.put_bytes(b"y" * (20 << 20), name="big", format="text", source={}, owner=Owner("alice"))

    asyncio.run(main())
    """
)


async def test_a_front_killed_mid_upload_leaves_no_object_and_no_row_after_the_sweep(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    # The line comes once a part's worth was handed to the upload.
    line = _killed_after_its_first_line(_KILLED_MID_UPLOAD, pg_migrated_url, bucket_url, str(tmp_path / "front"))
    assert line.startswith("uploading "), line
    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url, blob_grace_s=0.001)) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None
        key = line.split()[1]
        assert await object_rows(stores.lifecycle) == [(key, "intent")]
        assert await bucket.sweep() == 1
        assert await bucket.bucket.keys("c") == [] and await object_rows(stores.lifecycle) == []
        assert await bucket.orphans() == []


_KILLED_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from rlm_mcp.config import Settings
    from rlm_mcp.owners import Owner
    from rlm_mcp.store.bucket import Bucket
    from rlm_mcp.assembly import make_stores

    real_read = Bucket.read

    async def stalling_read(self, key):
        async for piece in real_read(self, key):
            yield piece
            print("fetching", flush=True)
            await asyncio.sleep(3600)  # killed here, the cache's temp file half written

    Bucket.read = stalling_read

    async def main():
        settings = Settings(database_url=sys.argv[1], blob_url=sys.argv[2], data_dir=sys.argv[3])
        async with make_stores(settings, replica=True) as stores:
            async with stores.contexts.in_use([sys.argv[4]], owner=Owner("alice")):
                pass

    asyncio.run(main())
    """
)


async def test_a_worker_killed_mid_fetch_leaves_no_orphan_and_fetches_again(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    data = os.urandom(3 << 20)
    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url)) as stores:
        info = await stores.contexts.put_bytes(
            data.hex().encode(), name="c", format="text", source={}, owner=Owner("alice")
        )
        before = await object_rows(stores.lifecycle)
    worker_dir = tmp_path / "worker"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WORKER, pg_migrated_url, bucket_url, str(worker_dir), info.context_id],
        stdout=subprocess.PIPE,
        env=os.environ.copy(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().startswith("fetching")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert [p.name for p in (worker_dir / "tmp").iterdir()]  # its half-written temp file (swept after a day)
    assert not (worker_dir / "cache" / info.sha256[:2] / info.sha256).exists()
    async with make_stores(
        bucket_settings(tmp_path, pg_migrated_url, bucket_url, "worker", blob_grace_s=0.001)
    ) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None
        assert await object_rows(stores.lifecycle) == before and await bucket.sweep() == 0
        assert await bucket.orphans() == []
        assert isinstance(stores.contexts, PgContextStore)
        async with stores.contexts.in_use([info.context_id], owner=Owner("alice")) as infos:
            assert await anyio.Path(stores.contexts.spec(infos[0]).path).read_bytes() == data.hex().encode()


async def test_a_replica_sweeps_at_its_heartbeat_once_the_grace_period_passed(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    from rlm_mcp.testing.waiting import wait_until

    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url)) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None
        key = await bucket.intend(owner="alice", sha256="ab" * 32, size=4)  # what a killed front leaves
        await bucket.bucket.put_bytes(key, b"left")
    settings = bucket_settings(
        tmp_path, pg_migrated_url, bucket_url, "sweeper", blob_grace_s=0.001, blob_sweep_interval_s=0.001
    )
    async with make_stores(settings, replica=True) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None

        async def swept() -> bool:
            return await bucket.bucket.keys("c") == [] and await object_rows(stores.lifecycle) == []

        await wait_until(swept, within_s=60, what="the heartbeat's sweep")
