"""The bucket store against a second, independent S3 server, `rclone serve s3` (SeaweedFS runs
every other bucket test): a multipart load by two owners, a second replica's streamed fetch, a
snapshot both ways, deletes that leave no object, and doctor's round trip."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.doctor import _bucket
from rlm_mcp.owners import Owner
from rlm_mcp.ports.session_store import AfterRun
from rlm_mcp.store.pg import bucket_of
from rlm_mcp.store.pg.contexts import PgContextStore
from tests.fixtures_bucket import BUCKET, SeaweedFS
from tests.fixtures_sessions import DAY, replica
from tests.fixtures_store import final, summary

pytestmark = pytest.mark.anyio


async def test_the_bucket_store_works_against_rclone_serve_s3(
    tmp_path: Path, pg_migrated_url: str, rclone_s3: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in rclone_s3.env().items():
        monkeypatch.setenv(name, value)
    blob_url = f"s3://{BUCKET}/t-{secrets.token_hex(6)}"
    data = os.urandom(6 << 20).hex().encode()  # 12 MiB: a multipart upload of two parts
    alice, bob = Owner("alice"), Owner("bob")

    def settings(name: str) -> Settings:
        return Settings(database_url=pg_migrated_url, blob_url=blob_url, data_dir=tmp_path / name)

    async with make_stores(settings("a"), replica=True) as a, make_stores(settings("b"), replica=True) as b:
        bucket = bucket_of(a)
        assert bucket is not None
        info = await a.contexts.put_bytes(data, name="big", format="text", source={}, owner=alice)
        await a.contexts.put_bytes(data, name="big", format="text", source={}, owner=bob)
        assert len(await bucket.bucket.keys("c")) == 2
        assert isinstance(b.contexts, PgContextStore)
        async with b.contexts.in_use([info.context_id], owner=bob) as infos:
            assert await anyio.Path(b.contexts.spec(infos[0]).path).read_bytes() == data
        assert await a.contexts.delete(info.context_id, owner=alice)
        assert await b.contexts.delete(info.context_id, owner=bob)
        assert await bucket.bucket.keys("c") == [] and await bucket.orphans() == []

    snapshot = tmp_path / "snap.bin"
    snapshot.write_bytes(os.urandom(5 << 20))
    async with replica(tmp_path, pg_migrated_url, "s", blob_url=blob_url) as (store, queue):
        await store.open("ses_r", "alice", "run_r", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_r", owner="alice"), 1)
        await store.finish_run("ses_r", "run_r", AfterRun(worker_id=1, began=True))
        assert await store.save_snapshot("ses_r", 1, snapshot, owner_cap=64 << 20) is None
        back = tmp_path / "back.bin"
        assert await store.read_snapshot_into("ses_r", back) == (1, 5 << 20)
        assert back.read_bytes() == snapshot.read_bytes()
        await queue.finish("run_r", final("run_r"))
        assert await store.close("ses_r")

    [row] = await _bucket(settings("doctor"))
    assert row.ok and "write, read and delete round trip" in row.detail, row
