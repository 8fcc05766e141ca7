"""Contexts belong to owners (issue 14 item 11): the same bytes stored by two owners share one
blob, and neither learns that the other has them."""

from __future__ import annotations

import sqlite3
import time

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.errors import NotFoundError
from rlm_mcp.events import TurnStart
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER, Owner, OwnerScope
from rlm_mcp.store import ContextStore
from tests.fixtures_both_stores import drop_ownership
from tests.fixtures_postgres import has_bytes
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio
BLOBS_IN_A_BUCKET = True  # the store's rules also over bytes in a bucket (store_settings' 'bucket')

ALICE, BOB = Owner("token-alice"), Owner("token-bob")


# The isolation tests run against both stores (`store_settings`: SQLite and PostgreSQL).


async def test_same_bytes_two_owners_see_only_their_own(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        await _same_bytes_two_owners(stores)


async def _same_bytes_two_owners(stores) -> None:
    store = stores.contexts
    a = await store.put_bytes(b"shared secret", name="alice's notes", format="text", source={"who": "a"}, owner=ALICE)
    assert await store.list(owner=BOB) == []
    with pytest.raises(NotFoundError, match="Unknown context id"):
        await store.get(a.context_id, owner=BOB)
    assert await store.delete(a.context_id, owner=BOB) is False
    with pytest.raises(NotFoundError):
        async with store.in_use([a.context_id], owner=BOB):
            pass

    b = await store.put_bytes(b"shared secret", name="bob's copy", format="text", source={"who": "b"}, owner=BOB)
    assert b.context_id == a.context_id  # content-addressed: one id, one blob
    # Each owner sees its own name and source, never the other's.
    assert [(i.name, i.source) for i in await store.list(owner=ALICE)] == [("alice's notes", {"who": "a"})]
    assert [(i.name, i.source) for i in await store.list(owner=BOB)] == [("bob's copy", {"who": "b"})]
    assert (await store.get(a.context_id, owner=ALICE)).name == "alice's notes"

    assert await store.delete(a.context_id, owner=ALICE) is True
    with pytest.raises(NotFoundError):
        await store.get(a.context_id, owner=ALICE)
    assert (await store.get(a.context_id, owner=BOB)).name == "bob's copy"
    assert await has_bytes(stores, a.sha256)  # Bob still has it
    assert await store.delete(b.context_id, owner=BOB) is True
    assert not await has_bytes(stores, a.sha256)
    assert await store.list(owner=EVERY_OWNER) == []


async def test_another_owners_run_does_not_show_through_a_delete(store_settings) -> None:
    async with make_stores(store_settings(context_grace_s=0), replica=True) as stores:
        await _another_owners_run(stores)


async def _another_owners_run(stores) -> None:
    store = stores.contexts
    info = await store.put_bytes(b"common bytes", name="a", format="text", source={}, owner=ALICE)
    await store.put_bytes(b"common bytes", name="b", format="text", source={}, owner=BOB)
    async with store.in_use([info.context_id], owner=BOB) as infos:
        assert infos[0].name == "b"
        # Alice has no run on it: her delete succeeds and says nothing about Bob's run.
        assert await store.delete(info.context_id, owner=ALICE) is True
        assert await has_bytes(stores, info.sha256)
    assert (await store.get(info.context_id, owner=BOB)).name == "b"


async def test_owner_run_blocks_own_delete_and_orphans_go_at_eviction(store_settings) -> None:
    async with make_stores(store_settings(context_grace_s=0), replica=True) as stores:
        await _own_run_blocks_delete(stores)


async def _own_run_blocks_delete(stores) -> None:
    store = stores.contexts
    info = await store.put_bytes(b"bytes held by a run", name="a", format="text", source={}, owner=ALICE)
    await store.put_bytes(b"bytes held by a run", name="b", format="text", source={}, owner=BOB)
    async with store.in_use([info.context_id], owner=ALICE):
        with pytest.raises(Exception, match="in use by a running run"):
            await store.delete(info.context_id, owner=ALICE)
        assert await store.delete(info.context_id, owner=BOB) is True
        # Alice's run still holds it; the operator's delete of every owner is refused too.
        with pytest.raises(Exception, match="in use by a running run"):
            await store.delete(info.context_id, owner=EVERY_OWNER)
    assert await store.delete(info.context_id, owner=ALICE) is True
    assert not await has_bytes(stores, info.sha256)


async def test_a_row_orphaned_while_pinned_is_evicted_once_unpinned(store_settings) -> None:
    async with make_stores(store_settings(), replica=True) as stores:  # default grace: orphans are not protected
        store = stores.contexts
        info = await store.put_bytes(b"orphan me", name="a", format="text", source={}, owner=ALICE)
        await store.put_bytes(b"orphan me", name="b", format="text", source={}, owner=BOB)
        async with store.in_use([info.context_id], owner=BOB):
            assert await store.delete(info.context_id, owner=ALICE)
            await drop_ownership(stores, BOB)  # Bob drops his ownership under his own run
            assert await store.evict() == []  # pinned: kept
            assert await has_bytes(stores, info.sha256)
        assert await store.evict() == [info.context_id]
        assert not await has_bytes(stores, info.sha256)


async def test_an_index_from_before_owners_is_the_local_users(settings) -> None:
    # SQLite only: an index file of rlm-mcp 0.1 (the PostgreSQL schema had owners from its first version).
    store = ContextStore(settings)
    store._prepare()
    now = time.time()
    with sqlite3.connect(store.db_path) as conn:  # the 0.1 schema, with one context
        conn.execute(
            "CREATE TABLE contexts (context_id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, name TEXT NOT NULL, "
            "bytes INTEGER NOT NULL, format TEXT NOT NULL, kind TEXT NOT NULL, chars INTEGER NOT NULL, "
            "created_at REAL NOT NULL, last_used_at REAL NOT NULL, source TEXT NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE pins (pin_id TEXT NOT NULL, context_id TEXT NOT NULL, host TEXT NOT NULL, "
            "pid INTEGER NOT NULL, proc_start TEXT, expires_at REAL NOT NULL)"
        )
        conn.execute(
            "INSERT INTO contexts VALUES ('ctx_old', ?, 'old', 3, 'text', 'str', 3, ?, ?, '{}')", ("ab" * 32, now, now)
        )
    store.blob_path("ab" * 32).parent.mkdir(parents=True)
    store.blob_path("ab" * 32).write_bytes(b"old")
    assert [i.context_id for i in await store.list(owner=LOCAL_OWNER)] == [
        "ctx_old"
    ]  # owner defaults to the local user
    assert await store.list(owner=ALICE) == []
    async with store.in_use(["ctx_old"], owner=LOCAL_OWNER) as infos:
        assert infos[0].name == "old"


async def test_run_records_are_their_owners(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        await _run_records_are_their_owners(stores.runs)


async def _run_records_are_their_owners(runs) -> None:
    log = await runs.create(run_record("run_alice", {"status": "running", "owner": ALICE}))
    await log.append(TurnStart(run_id="run_alice", iteration=1, max_iterations=1, depth=0))
    await log.aclose()
    await (await runs.create(run_record("run_old", {"status": "completed"}))).aclose()  # a record from before owners
    assert (await runs.read_summary("run_alice", owner=ALICE)).request.owner == ALICE
    assert [e.type for e in await runs.read_events("run_alice", owner=ALICE)] == ["turn_start"]
    with pytest.raises(NotFoundError, match="Unknown run id 'run_alice'"):
        await runs.read_summary("run_alice", owner=BOB)
    with pytest.raises(NotFoundError, match="Unknown run id 'run_alice'"):
        await runs.read_events("run_alice", owner=BOB)
    assert (await runs.read_summary("run_old", owner=EVERY_OWNER)).status == "completed"  # the operator
    assert (await runs.read_summary("run_old", owner="local")).status == "completed"
    with pytest.raises(NotFoundError):
        await runs.read_summary("run_old", owner=ALICE)
    assert [r.run_id for r in await runs.list(owner=ALICE)] == ["run_alice"]
    assert await runs.list(owner=BOB) == []
    assert {r.run_id for r in await runs.list(owner=EVERY_OWNER)} == {"run_alice", "run_old"}


def test_one_visibility_rule_for_run_records() -> None:
    """The store's rule, which the viewer uses too: a record is its owner's; one written before
    owners existed is the local user's; EVERY_OWNER (the operator's view) sees every record."""
    from rlm_mcp.owners import sees
    from rlm_mcp.ports.runs import RunRecord

    def owned_by(stored: dict[str, str], scope: OwnerScope) -> bool:
        return sees(scope, RunRecord.from_stored({"run_id": "r", **stored}).request.owner)

    assert owned_by({"owner": ALICE}, ALICE) and not owned_by({"owner": ALICE}, LOCAL_OWNER)
    assert owned_by({}, LOCAL_OWNER) and not owned_by({}, ALICE)
    assert owned_by({"owner": ALICE}, EVERY_OWNER) and owned_by({}, EVERY_OWNER)


@pytest.mark.parametrize("context_id", ["ctx_\ud800", "ctx_é", "\x00"])
async def test_an_id_no_context_can_have_is_unknown_in_every_store(store_settings, context_id: str) -> None:
    # A lone surrogate cannot even be encoded for the database driver: it must be an unknown id,
    # never an internal error, whichever store is behind the service.
    async with make_stores(store_settings()) as stores:
        with pytest.raises(NotFoundError, match="Unknown context id"):
            await stores.contexts.get(context_id, owner=LOCAL_OWNER)
        assert await stores.contexts.delete(context_id, owner=LOCAL_OWNER) is False


async def test_an_owners_loads_evict_its_own_contexts_first(store_settings) -> None:
    """Issue 20 item 8: over the store's cap, the loader's least recently used contexts go
    before another owner's, which go only when the loader's own cannot make room."""
    async with make_stores(store_settings(store_max_bytes=250, context_grace_s=0)) as stores:
        store = stores.contexts
        bob = await store.put_bytes(b"b" * 100, name="bob's", format="text", source={}, owner=BOB)
        first = await store.put_bytes(b"1" * 100, name="a1", format="text", source={}, owner=ALICE)
        await store.put_bytes(b"2" * 100, name="a2", format="text", source={}, owner=ALICE)
        # Bob's is the least recently used, yet Alice's own older context made the room.
        assert (await store.get(bob.context_id, owner=BOB)).name == "bob's"
        with pytest.raises(NotFoundError, match="Unknown context id"):
            await store.get(first.context_id, owner=ALICE)
        await store.put_bytes(b"3" * 150, name="a3", format="text", source={}, owner=ALICE)
        assert [i.name for i in await store.list(owner=ALICE)] == ["a3"]
        assert [i.name for i in await store.list(owner=BOB)] == ["bob's"]
        # When Alice's own cannot make room (what she just stored is kept), Bob's goes too.
        await store.put_bytes(b"4" * 200, name="a4", format="text", source={}, owner=ALICE)
        assert [i.name for i in await store.list(owner=ALICE)] == ["a4"]
        assert await store.list(owner=BOB) == []
