"""Each owner's share of the store (issue 20 item 8, RLM_MCP_STORE_MAX_BYTES_PER_OWNER): an
owner's new contexts release its own least recently used ones, never another owner's; a context
the owner's protected ones leave no room for is refused; unfinished uploads belong to the owner
that started them and count against its own share. Every refusal speaks only of the caller's
own usage. Both stores (`store_settings`: SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.errors import NotFoundError, TooLargeError
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER, Owner
from rlm_mcp.store import ContextStore, UploadStore
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.owner_caps import Held, release_for_share
from tests.fixtures_postgres import has_bytes
from tests.fixtures_store import make_settings

pytestmark = pytest.mark.anyio
BLOBS_IN_A_BUCKET = True  # the store's rules also over bytes in a bucket (store_settings' 'bucket')

ALICE, BOB = Owner("token-alice"), Owner("token-bob")


async def _put(stores: Stores, data: bytes, name: str, owner: Owner) -> Any:
    return await stores.contexts.put_bytes(data, name=name, format="text", source={}, owner=owner)


async def _names(stores: Stores, owner: Owner) -> list[str]:
    return sorted(i.name for i in await stores.contexts.list(owner=owner))


async def test_an_owners_new_context_releases_its_own_oldest_never_anothers(store_settings) -> None:
    async with make_stores(store_settings(store_max_bytes_per_owner=250, context_grace_s=0)) as stores:
        shared = await _put(stores, b"s" * 100, "alice's copy", ALICE)
        await _put(stores, b"s" * 100, "bob's copy", BOB)  # the same bytes: one blob, two owners
        await _put(stores, b"b" * 150, "bob's own", BOB)  # Bob at his share: 250
        await _put(stores, b"1" * 100, "a1", ALICE)
        await _put(stores, b"2" * 100, "a2", ALICE)  # 300 > 250: Alice's least recently used goes
        assert await _names(stores, ALICE) == ["a1", "a2"]
        # Only Alice's ownership went: Bob still has the shared bytes, and all of his own.
        assert await _names(stores, BOB) == ["bob's copy", "bob's own"]
        assert (await stores.contexts.get(shared.context_id, owner=BOB)).name == "bob's copy"
        assert await has_bytes(stores, shared.sha256)
        a3 = await _put(stores, b"3" * 200, "a3", ALICE)  # both of Alice's older ones go
        assert await _names(stores, ALICE) == ["a3"]
        assert await has_bytes(stores, a3.sha256)
        assert len(await stores.contexts.list(owner=EVERY_OWNER)) == 3  # a1 and a2's bytes are gone
        # Storing bytes she holds already adds nothing to her share.
        await _put(stores, b"3" * 200, "a3 again", ALICE)
        assert await _names(stores, ALICE) == ["a3 again"]


async def test_what_the_owners_protected_contexts_leave_no_room_for_is_refused(store_settings) -> None:
    # The default grace (15 min) protects what was just stored: the load -> run gap.
    async with make_stores(store_settings(store_max_bytes_per_owner=250)) as stores:
        await _put(stores, b"b" * 240, "bob's", BOB)
        await _put(stores, b"1" * 100, "a1", ALICE)
        await _put(stores, b"2" * 100, "a2", ALICE)
        with pytest.raises(TooLargeError) as caught:
            await _put(stores, b"3" * 100, "a3", ALICE)
        message = str(caught.value)
        assert "Your contexts" in message and "hold 200 bytes" in message and "(100 bytes)" in message
        assert "RLM_MCP_STORE_MAX_BYTES_PER_OWNER (250 bytes)" in message and "240" not in message
        assert await _names(stores, ALICE) == ["a1", "a2"]  # nothing released, nothing stored
        assert not await has_bytes(stores, _sha(b"3" * 100))
        assert await _names(stores, BOB) == ["bob's"]
        with pytest.raises(TooLargeError, match="larger than each owner's share"):
            await _put(stores, b"4" * 251, "too big", ALICE)


async def test_a_context_in_the_owners_run_is_never_released(store_settings) -> None:
    async with make_stores(store_settings(store_max_bytes_per_owner=250, context_grace_s=0), replica=True) as stores:
        a1 = await _put(stores, b"1" * 100, "a1", ALICE)
        await _put(stores, b"2" * 100, "a2", ALICE)
        async with stores.contexts.in_use([a1.context_id], owner=ALICE):
            await _put(stores, b"3" * 100, "a3", ALICE)  # a1 is the oldest, but in use: a2 goes
            assert await _names(stores, ALICE) == ["a1", "a3"]
            with pytest.raises(TooLargeError, match="in the last 0 s hold 100 bytes"):
                await _put(stores, b"4" * 200, "a4", ALICE)  # a3 may go, a1 (100) may not: no room
            assert await _names(stores, ALICE) == ["a1", "a3"]  # refused whole: a3 was not released


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _chunk(stores: Stores, data: bytes, index: int, upload_id: str | None, owner: Owner) -> Any:
    return await stores.uploads.put_chunk(
        data=data, index=index, upload_id=upload_id, final=False, sha256=None, name=None, format=None, owner=owner
    )


async def test_unfinished_uploads_count_against_their_owners_share(store_settings) -> None:
    async with make_stores(store_settings(store_max_bytes_per_owner=1000, store_max_bytes=1 << 20)) as stores:
        alice = await _chunk(stores, b"a" * 600, 0, None, ALICE)
        with pytest.raises(TooLargeError) as caught:
            await _chunk(stores, b"a" * 500, 1, alice.upload_id, ALICE)
        message = str(caught.value)
        assert "Your uploads in progress hold 600 bytes; 500 more" in message
        assert "RLM_MCP_STORE_MAX_BYTES_PER_OWNER (1000 bytes)" in message
        with pytest.raises(TooLargeError, match="hold 600 bytes"):
            await _chunk(stores, b"x" * 500, 0, None, ALICE)  # a second upload of hers too
        # Bob's own share is untouched by Alice's uploads, and his refusal speaks of his alone.
        bob = await _chunk(stores, b"b" * 900, 0, None, BOB)
        with pytest.raises(TooLargeError) as caught:
            await _chunk(stores, b"b" * 200, 1, bob.upload_id, BOB)
        assert "hold 900 bytes" in str(caught.value) and "600" not in str(caught.value)
        done = await stores.uploads.put_chunk(
            data=b"a" * 400, index=1, upload_id=alice.upload_id, final=True, sha256=None, name="a", format=None,
            owner=ALICE,
        )  # fmt: skip
        assert done.done and done.context is not None and done.context.bytes == 1000
        # Once stored, her upload's bytes are a context: her pending share is free again.
        assert (await _chunk(stores, b"c" * 1000, 0, None, ALICE)).bytes_received == 1000


async def test_an_upload_belongs_to_the_owner_that_started_it(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        alice = await _chunk(stores, b"alice's first chunk ", 0, None, ALICE)
        with pytest.raises(NotFoundError, match=f"Unknown upload id '{alice.upload_id}'"):
            await _chunk(stores, b"bob's chunk", 1, alice.upload_id, BOB)
        with pytest.raises(NotFoundError, match="Unknown upload id"):
            await stores.uploads.put_chunk(
                data=b"bob's end", index=1, upload_id=alice.upload_id, final=True, sha256=None, name=None,
                format=None, owner=BOB,
            )  # fmt: skip
        done = await stores.uploads.put_chunk(
            data=b"and her last", index=1, upload_id=alice.upload_id, final=True, sha256=None, name="a",
            format=None, owner=ALICE,
        )  # fmt: skip
        assert done.done and done.context is not None
        with pytest.raises(NotFoundError):  # a resend of the final chunk too
            await stores.uploads.put_chunk(
                data=b"and her last", index=1, upload_id=alice.upload_id, final=True, sha256=None, name=None,
                format=None, owner=BOB,
            )  # fmt: skip
        assert await stores.contexts.list(owner=BOB) == []


async def test_without_a_share_one_owner_may_use_the_whole_store(store_settings) -> None:
    async with make_stores(store_settings(store_max_bytes=1000)) as stores:
        alice = await _chunk(stores, b"a" * 900, 0, None, ALICE)
        assert alice.bytes_received == 900
        for i in range(3):
            await _put(stores, bytes([65 + i]) * 300, f"a{i}", ALICE)
        assert await _names(stores, ALICE) == ["a0", "a1", "a2"]  # within the grace: kept


async def test_an_index_from_before_upload_owners_keeps_its_uploads_open(tmp_path: Path) -> None:
    """SQLite files written before uploads recorded their owner gain the column; an upload in
    progress across the upgrade stays open to whoever holds its id (it expires within a day)."""
    settings = make_settings(tmp_path)
    contexts = ContextStore(settings.store)
    contexts._prepare()
    now = time.time()
    with sqlite3.connect(contexts.db_path) as conn:
        conn.execute(
            "CREATE TABLE uploads (upload_id TEXT PRIMARY KEY, next_index INTEGER NOT NULL, "
            "bytes_received INTEGER NOT NULL, last_chunk_sha TEXT, name TEXT, format TEXT, created_at REAL NOT NULL, "
            "updated_at REAL NOT NULL, done INTEGER NOT NULL DEFAULT 0, context_id TEXT)"
        )
        conn.execute(
            "INSERT INTO uploads VALUES ('upl_' || ?, 1, 4, ?, NULL, NULL, ?, ?, 0, NULL)",
            ("0" * 24, _sha(b"old "), now, now),
        )
    (Path(settings.store.data_dir) / "uploads" / ("upl_" + "0" * 24)).mkdir(parents=True)
    (Path(settings.store.data_dir) / "uploads" / ("upl_" + "0" * 24) / "00000000.part").write_bytes(b"old ")
    uploads = UploadStore(settings.store, contexts)
    done = await uploads.put_chunk(
        data=b"upload", index=1, upload_id="upl_" + "0" * 24, final=True, sha256=None, name="legacy", format=None,
        owner=LOCAL_OWNER,
    )  # fmt: skip
    assert done.done and done.context is not None and done.context.bytes == len(b"old upload")


def test_the_share_rule_counts_each_of_the_owners_blobs_once() -> None:
    held = [
        Held("ctx_a", "sha-a", 100, 1.0, False),
        Held("ctx_a_json", "sha-a", 100, 2.0, False),  # the same bytes as JSON: one blob
        Held("ctx_b", "sha-b", 100, 3.0, False),
    ]
    # 200 held; adding 100 fits a share of 300, 400 would not fit even empty.
    assert release_for_share(held, adding_sha256="sha-c", adding_bytes=100, share=300, now=10, grace_s=0) == []
    # A share of 250: both ids of blob a must go before its bytes stop counting.
    assert release_for_share(held, adding_sha256="sha-c", adding_bytes=100, share=250, now=10, grace_s=0) == [
        "ctx_a",
        "ctx_a_json",
    ]
    assert release_for_share(held, adding_sha256="sha-b", adding_bytes=100, share=1, now=10, grace_s=0) == []
    assert release_for_share(held, adding_sha256="sha-c", adding_bytes=100, share=None, now=10, grace_s=0) == []


async def test_a_database_from_before_upload_owners_keeps_its_uploads_open(tmp_path: Path, pg_url: str) -> None:
    """Migration 2 adds the owner column; an upload in progress across the upgrade stays open."""
    import psycopg

    from rlm_mcp.store.pg import migrations

    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        assert await migrations.migrate(conn, target=1) == 1  # the schema of the release before: 0001 only
        await conn.execute(
            "INSERT INTO rlm_uploads (upload_id, next_index, bytes_received, last_chunk_sha, created_at, "
            "updated_at) VALUES (%s, 1, 4, %s, %s, %s)",
            ("upl_" + "0" * 24, _sha(b"old "), time.time(), time.time()),
        )
        await conn.execute("INSERT INTO rlm_upload_chunks VALUES (%s, 0, %b)", ("upl_" + "0" * 24, b"old "))
    async with make_stores(make_settings(tmp_path, database_url=pg_url)) as stores:
        done = await stores.uploads.put_chunk(
            data=b"upload", index=1, upload_id="upl_" + "0" * 24, final=True, sha256=None, name="legacy",
            format=None, owner=BOB,
        )  # fmt: skip
        assert done.done and done.context is not None and done.context.bytes == len(b"old upload")
        assert (await _chunk(stores, b"new", 0, None, ALICE)).bytes_received == 3


async def test_replicas_storing_for_one_owner_at_once_never_pass_its_share(tmp_path: Path, pg_url: str) -> None:
    """Two replicas spend one owner's share one at a time (a lock of that owner's): of four
    contexts stored at once on two replicas, with room for one, exactly one is stored."""

    def replica(name: str) -> Stores:
        return make_stores(
            make_settings(tmp_path, data_dir=tmp_path / name, database_url=pg_url, store_max_bytes_per_owner=150),
            replica=True,
        )

    outcomes: list[str] = []
    async with replica("a") as a, replica("b") as b:

        async def store(stores: Stores, i: int) -> None:
            try:
                await _put(stores, bytes([65 + i]) * 100, f"c{i}", ALICE)
                outcomes.append("stored")
            except TooLargeError:
                outcomes.append("refused")

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(store, (a, b)[i % 2], i)
        assert sorted(outcomes) == ["refused", "refused", "refused", "stored"]
        assert len(await a.contexts.list(owner=ALICE)) == 1


async def test_replicas_starting_uploads_for_one_owner_at_once_never_pass_its_share(
    tmp_path: Path, pg_url: str
) -> None:
    def replica(name: str) -> Stores:
        return make_stores(
            make_settings(tmp_path, data_dir=tmp_path / name, database_url=pg_url, store_max_bytes_per_owner=150),
            replica=True,
        )

    outcomes: list[str] = []
    async with replica("a") as a, replica("b") as b:

        async def start(stores: Stores, i: int) -> None:
            try:
                await _chunk(stores, bytes([65 + i]) * 100, 0, None, ALICE)
                outcomes.append("started")
            except TooLargeError:
                outcomes.append("refused")

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(start, (a, b)[i % 2], i)
    assert sorted(outcomes) == ["refused", "refused", "refused", "started"]
