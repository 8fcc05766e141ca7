"""Team mode's bytes in a real S3 bucket (SeaweedFS, `fixtures_bucket`) beside a real PostgreSQL:
each owner's objects are its own and their keys tell no token; released objects go at once and
the index never names a missing one; snapshots go up and come down streamed and go with their
session; a front killed mid-upload, or between its upload and its commit, leaves nothing once the
sweep ran; a replica sweeps at its heartbeat; its cache keeps to its bound; a
worker killed mid-fetch leaves no object, row or cached file behind; an unreachable bucket is named
as such. (The store's behavioural tests run over the bucket too: `store_settings`' 'bucket'.)"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import anyio
import pytest

from rlm_mcp.access import owner_of_token
from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.owners import Owner
from rlm_mcp.ports.session_store import AfterRun
from rlm_mcp.store.bucket import BucketError
from rlm_mcp.store.pg import Database, bucket_of
from rlm_mcp.store.pg.contexts import PgContextStore
from rlm_mcp.testing.servers import free_port
from tests.fixtures_bucket import SECRET, bucket_settings, object_rows
from tests.fixtures_sessions import DAY, replica
from tests.fixtures_store import final, summary

pytestmark = pytest.mark.anyio

ALICE = Owner(owner_of_token("alice-token-" + "a" * 20))
BOB = Owner(owner_of_token("bob-token-" + "b" * 20))


async def test_each_owner_has_its_own_objects_and_their_keys_tell_no_token(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    data = b"the same report, " * 70000  # about 1.2 MiB
    sha = hashlib.sha256(data).hexdigest()
    async with (
        make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url), replica=True) as a,
        make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url, "b"), replica=True) as b,
    ):
        bucket = bucket_of(a)
        assert bucket is not None
        one = await a.contexts.put_bytes(data, name="r", format="text", source={}, owner=ALICE)
        await a.contexts.put_bytes(data, name="r", format="text", source={}, owner=BOB)
        await a.contexts.put_bytes(data, name="again", format="text", source={}, owner=ALICE)  # held: no new object
        keys = await bucket.bucket.keys("c")
        assert len(keys) == 2 and len({k.split("/")[1] for k in keys}) == 2  # one per owner, under its own key
        for key in keys:
            assert ALICE not in key and BOB not in key and "alice-token" not in key and "bob-token" not in key
        async with a.lifecycle.connection() as conn:  # type: ignore[attr-defined]
            cur = await conn.execute("SELECT count(*) AS n, sum(octet_length(data)) AS b FROM rlm_blob_chunks")
            counted = await cur.fetchone()
        assert counted is not None and counted["n"] == 0  # the database holds no context bytes

        # Another replica fetches into its own cache, streamed and checked against the digest.
        assert isinstance(b.contexts, PgContextStore)
        async with b.contexts.in_use([one.context_id], owner=BOB) as infos:
            assert await anyio.Path(b.contexts.spec(infos[0]).path).read_bytes() == data

        assert await a.contexts.delete(one.context_id, owner=ALICE)
        left = await bucket.bucket.keys("c")
        assert len(left) == 1 and left[0] in keys and await object_rows(a.lifecycle) == [(left[0], "live")]
        assert await b.contexts.delete(one.context_id, owner=BOB)
        assert await bucket.bucket.keys("c") == [] and await object_rows(a.lifecycle) == []
        assert sha not in str(await bucket.orphans())


async def test_snapshots_are_objects_streamed_both_ways_and_go_with_their_session(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    snapshot = tmp_path / "snap.bin"
    snapshot.write_bytes(os.urandom(3 << 20) + b"end")
    async with replica(tmp_path, pg_migrated_url, "a", blob_url=bucket_url) as (store, queue):
        bucket = store._bucket
        assert bucket is not None
        await store.open("ses_b1", "alice", "run_b1", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_b1", owner="alice"), 1)
        assert await store.finish_run("ses_b1", "run_b1", AfterRun(worker_id=1, began=True))
        assert await store.save_snapshot("ses_b1", 1, snapshot, owner_cap=64 << 20) is None
        first = await bucket.bucket.keys("s")
        assert len(first) == 1
        back = tmp_path / "back.bin"
        assert await store.read_snapshot_into("ses_b1", back) == (1, snapshot.stat().st_size)
        assert back.read_bytes() == snapshot.read_bytes()
        db = store._db
        async with db.connection() as conn:
            cur = await conn.execute("SELECT count(*) AS n FROM rlm_session_snapshots")
            assert (await cur.fetchone())["n"] == 0  # type: ignore[index]

        assert await store.save_snapshot("ses_b1", 1, b"newer", owner_cap=64 << 20) is None
        second = await bucket.bucket.keys("s")
        assert len(second) == 1 and second != first  # the replaced snapshot's object went
        assert await store.read_snapshot("ses_b1") == (1, b"newer")

        await queue.finish("run_b1", final("run_b1"))
        assert await store.close("ses_b1")
        assert await bucket.bucket.keys("s") == [] and await object_rows(db) == []


async def test_an_unreachable_bucket_is_named_not_the_database_and_cached_contexts_still_run(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url)) as stores:
        cached = await stores.contexts.put_bytes(
            b"cached here", name="c", format="text", source={}, owner=Owner("alice")
        )
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there now
    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url, blob_timeout_s=2.0)) as stores:
        with pytest.raises(BucketError) as caught:
            await stores.contexts.put_bytes(b"hello", name="h", format="text", source={}, owner=Owner("alice"))
        assert [c.context_id for c in await stores.contexts.list(owner=Owner("alice"))] == [cached.context_id]
        assert isinstance(stores.contexts, PgContextStore)
        async with stores.contexts.in_use([cached.context_id], owner=Owner("alice")) as infos:  # cached: runs
            assert await anyio.Path(stores.contexts.spec(infos[0]).path).read_bytes() == b"cached here"
    async with make_stores(
        bucket_settings(tmp_path, pg_migrated_url, bucket_url, "other", blob_timeout_s=2.0)
    ) as stores:
        assert isinstance(stores.contexts, PgContextStore)
        with pytest.raises(BucketError) as fetching:  # another replica has no copy: it must fetch, and says why not
            async with stores.contexts.in_use([cached.context_id], owner=Owner("alice")):
                pass
    for error in (caught.value, fetching.value):
        text = str(error)
        assert f"The bucket {bucket_url} is unreachable" in text and "database" not in error.cause
        assert SECRET not in text and "AWS_ENDPOINT_URL" in text


async def test_doctor_has_a_bucket_row_and_names_an_unreachable_one(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlm_mcp.doctor import _bucket

    settings = bucket_settings(tmp_path, pg_migrated_url, bucket_url)
    [row] = await _bucket(settings)
    assert row.name == "bucket" and row.ok and not row.warn, row
    assert f"{bucket_url}: write, read and delete round trip, clock within" in row.detail
    async with make_stores(settings) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None and await bucket.bucket.keys("doctor") == []  # its object deleted
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    [down] = await _bucket(settings.model_copy(update={"blob_timeout_s": 2.0}))
    assert not down.ok and f"The bucket {bucket_url} is unreachable" in down.detail
    assert SECRET not in down.detail + down.fix


async def test_blobs_move_moves_rows_to_the_bucket_resumably_and_reads_fall_back_until_then(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from rlm_mcp.cli.blobs import blobs_move

    shared = b"shared bytes\n" * 200000  # about 2.5 MiB: three chunk rows
    own = b"alice's alone\n" * 1000
    rows_only = Settings(database_url=pg_migrated_url, data_dir=tmp_path / "old")
    async with replica(tmp_path, pg_migrated_url, "old") as (sessions, queue):
        await sessions.open("ses_m", "alice", "run_m", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_m", owner="alice"), 1)
        await sessions.finish_run("ses_m", "run_m", AfterRun(worker_id=1, began=True))
        assert await sessions.save_snapshot("ses_m", 1, b"snap" * 1000, owner_cap=1 << 20) is None
    async with make_stores(rows_only) as stores:
        one = await stores.contexts.put_bytes(shared, name="s", format="text", source={}, owner=ALICE)
        await stores.contexts.put_bytes(shared, name="s", format="text", source={}, owner=BOB)
        two = await stores.contexts.put_bytes(own, name="o", format="text", source={}, owner=ALICE)

    settings = bucket_settings(tmp_path, pg_migrated_url, bucket_url, "mover")
    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url, "reader")) as reader:
        assert isinstance(reader.contexts, PgContextStore)
        async with reader.contexts.in_use([two.context_id], owner=ALICE) as infos:  # not moved yet: from the rows
            assert await anyio.Path(reader.contexts.spec(infos[0]).path).read_bytes() == own

    assert await blobs_move(argparse.Namespace(dry_run=True), settings) == 0
    dry = capsys.readouterr().out
    expected = 2 * len(shared) + len(own)
    assert f"2 content(s), {expected / (1 << 20):,.1f} MiB" in dry and "1 snapshot(s), 4,000 bytes" in dry
    assert "Nothing moved (--dry-run)." in dry

    assert await blobs_move(argparse.Namespace(dry_run=False), settings) == 0
    assert "Moved 2 content(s) and 1 snapshot(s)" in capsys.readouterr().out
    assert await blobs_move(argparse.Namespace(dry_run=False), settings) == 0  # resumable: nothing left
    assert "Nothing to move." in capsys.readouterr().out

    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url, "fresh")) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM rlm_blob_chunks) AS c, (SELECT count(*) FROM rlm_session_snapshots) AS s"
            )
            assert await cur.fetchone() == {"c": 0, "s": 0}  # the database holds no bytes now
        assert (
            len([row for row in await object_rows(db) if row[1] == "live"]) == 4
        )  # 2 + 1 contexts' objects, 1 snapshot
        assert isinstance(stores.contexts, PgContextStore)
        async with stores.contexts.in_use([one.context_id, two.context_id], owner=ALICE) as infos:
            got = [await anyio.Path(stores.contexts.spec(i).path).read_bytes() for i in infos]
        assert got == [shared, own]
    async with replica(tmp_path, pg_migrated_url, "after", blob_url=bucket_url) as (sessions, _):
        assert await sessions.read_snapshot("ses_m") == (1, b"snap" * 1000)


async def test_a_replicas_cache_keeps_to_its_bound_sparing_what_its_runs_pin(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    texts = [bytes([65 + i]) * (1 << 20) for i in range(3)]
    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url)) as stores:
        ids = [
            (await stores.contexts.put_bytes(t, name=f"c{i}", format="text", source={}, owner=ALICE)).context_id
            for i, t in enumerate(texts)
        ]
    bounded = bucket_settings(tmp_path, pg_migrated_url, bucket_url, "worker").model_copy(
        update={"cache_max_bytes": 1 << 19}
    )
    # Not a replica: no heartbeat sweeps behind the test's back (the heartbeat runs this same sweep).
    async with make_stores(bounded) as stores:
        contexts, db = stores.contexts, stores.lifecycle
        assert isinstance(contexts, PgContextStore) and isinstance(db, Database)
        for cid in ids:  # fetched in this order: the first is the least recently used
            async with contexts.in_use([cid], owner=ALICE):
                pass
        assert sorted(contexts.cache.cached()) == sorted(await _shas(db, ids))
        async with contexts.in_use([ids[0]], owner=ALICE) as infos:  # pinned by a run (and used now)
            swept = await contexts.cache.sweep(db)
            assert sorted(swept) == sorted(await _shas(db, ids[1:]))  # past the bound: all but the pinned
            assert contexts.cache.cached() == [infos[0].sha256]
        async with contexts.in_use([ids[2]], owner=ALICE) as infos:  # gone from the cache: fetched again
            assert await anyio.Path(contexts.spec(infos[0]).path).read_bytes() == texts[2]


async def _shas(db: Database, context_ids: list[str]) -> list[str]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT sha256 FROM rlm_contexts WHERE context_id = ANY(%s)", (context_ids,))
        return [r["sha256"] for r in await cur.fetchall()]
