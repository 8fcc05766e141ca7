"""The store's rules (`store.contexts`, `store.uploads`), written once over an index, tested in the
fast tier against the SQLite index: the upload state machine and its error texts, owner shares,
eviction order, deletes under a pin; and the SQLite transaction beneath them (statements sent
late still roll back, a cancelled transaction gives the lock back). The same rules over both
stores: tests/postgres/test_store_*.py (parametrized by `store_settings`)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.errors import BadArgumentError, NotFoundError, TooLargeError
from rlm_mcp.owners import Owner
from rlm_mcp.store import ContextStore, UploadStore
from rlm_mcp.store.sqlite_tx import SqliteTx, transaction
from rlm_mcp.store.statements import POSTGRES, SQLITE, Statements
from rlm_mcp.store.upload_model import UploadState
from rlm_mcp.testing.settings import make_settings

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")
BOB = Owner("bob")
DEADLINE_S = 30.0


def _stores(tmp_path: Path, **overrides: Any) -> tuple[ContextStore, UploadStore]:
    contexts = ContextStore(make_settings(tmp_path, **overrides).store)
    return contexts, UploadStore(contexts.settings, contexts)


async def _chunk(
    uploads: UploadStore, data: bytes, index: int, upload_id: str | None = None, *, owner: Owner = ALICE, **kw: Any
) -> UploadState:
    return await uploads.put_chunk(
        data=data,
        index=index,
        upload_id=upload_id,
        final=kw.get("final", False),
        sha256=kw.get("sha256"),
        name=kw.get("name"),
        format=None,
        owner=owner,
    )


# --- the statements, rendered per dialect ------------------------------------------------------


@pytest.mark.parametrize(("statements", "prefix", "placeholder"), [(SQLITE, "", "?"), (POSTGRES, "rlm_", "%s")])
def test_every_statement_names_its_dialects_tables_and_placeholders(
    statements: Statements, prefix: str, placeholder: str
) -> None:
    for name, sql in vars(statements).items():
        assert "{" not in sql and "}" not in sql, name
        assert f"FROM {prefix}" in sql or f"INTO {prefix}" in sql or f"UPDATE {prefix}" in sql, name
        if placeholder == "%s":
            assert "?" not in sql, name
    assert POSTGRES.upload_row_locked.endswith("FOR UPDATE")
    assert SQLITE.upload_row_locked == SQLITE.upload_row  # the write transaction excludes other writers


# --- the upload state machine ------------------------------------------------------------------


async def test_an_upload_goes_from_its_first_chunk_to_a_context(tmp_path: Path) -> None:
    contexts, uploads = _stores(tmp_path)
    first = await _chunk(uploads, b"hello ", 0, name="greeting")
    assert (first.next_index, first.bytes_received, first.done) == (1, 6, False)
    again = await _chunk(uploads, b"hello ", 0, first.upload_id)  # a retry after a lost reply
    assert again == first
    done = await _chunk(uploads, b"world", 1, first.upload_id, final=True)
    assert done.done and done.context is not None and done.next_index == 2
    assert done.context.name == "greeting" and done.context.bytes == 11
    resent = await _chunk(uploads, b"world", 1, first.upload_id, final=True)
    assert resent.done and resent.context == await contexts.get(done.context.context_id, owner=ALICE)
    with pytest.raises(BadArgumentError, match=r"is already complete \(context 'ctx_"):
        await _chunk(uploads, b"more", 2, first.upload_id)


async def test_each_wrong_chunk_is_refused_with_what_to_send_instead(tmp_path: Path) -> None:
    _, uploads = _stores(tmp_path)
    with pytest.raises(BadArgumentError, match="Chunk 1 came without an upload_id"):
        await _chunk(uploads, b"x", 1)
    state = await _chunk(uploads, b"abc", 0)
    with pytest.raises(BadArgumentError, match="was already stored with different bytes") as exc:
        await _chunk(uploads, b"abd", 0, state.upload_id)
    assert "Send the next chunk, index 1" in str(exc.value)
    with pytest.raises(BadArgumentError, match="is out of order: upload '.*' expects index 1"):
        await _chunk(uploads, b"def", 3, state.upload_id)
    with pytest.raises(NotFoundError, match="uploads expire 24 h after their last chunk"):
        await _chunk(uploads, b"def", 1, "upl_" + "0" * 24)
    with pytest.raises(NotFoundError):
        await _chunk(uploads, b"def", 1, "not-an-upload-id")
    with pytest.raises(NotFoundError):  # another owner's upload: as if it did not exist
        await _chunk(uploads, b"def", 1, state.upload_id, owner=BOB)
    assert (await _chunk(uploads, b"def", 1, state.upload_id)).next_index == 2


async def test_a_final_chunk_with_the_wrong_digest_may_be_resent(tmp_path: Path) -> None:
    _, uploads = _stores(tmp_path)
    state = await _chunk(uploads, b"part one, ", 0)
    with pytest.raises(BadArgumentError):
        await _chunk(uploads, b"part two", 1, state.upload_id, final=True, sha256="0" * 64)
    right = hashlib.sha256(b"part one, part two").hexdigest()
    done = await _chunk(uploads, b"part two", 1, state.upload_id, final=True, sha256=right)
    assert done.done and done.context is not None and done.context.sha256 == right


async def test_unfinished_uploads_count_against_the_owners_share(tmp_path: Path) -> None:
    _, uploads = _stores(tmp_path, store_max_bytes_per_owner=10)
    state = await _chunk(uploads, b"x" * 8, 0)
    with pytest.raises(TooLargeError):
        await _chunk(uploads, b"y" * 4, 1, state.upload_id)
    await _chunk(uploads, b"z" * 8, 0, owner=BOB)  # each owner has a share of its own


# --- contexts ----------------------------------------------------------------------------------


async def _put(contexts: ContextStore, data: bytes, owner: Owner = ALICE) -> str:
    info = await contexts.put_bytes(data, name="n", format="text", source={}, owner=owner)
    return info.context_id


async def test_the_sqlite_index_stamps_and_ages_by_its_clock(tmp_path: Path) -> None:
    """SQLite's transactions take their `now` from the index's clock (this process's): the
    times written, the grace period and the age cap all follow it."""
    contexts, uploads = _stores(tmp_path, store_max_age_days=1.0)
    contexts.files.clock = lambda: 1_000_000.0
    cid = await _put(contexts, b"old")
    assert (await contexts.get(cid, owner=ALICE)).created_at == 1_000_000.0
    started = await _chunk(uploads, b"part", 0)
    contexts.files.clock = lambda: 1_000_000.0 + 2 * 86400
    assert await contexts.evict() == [cid]
    with pytest.raises(NotFoundError, match="expire"):
        await _chunk(uploads, b"more", 1, started.upload_id)


async def test_a_share_releases_the_owners_least_recently_used_context(tmp_path: Path) -> None:
    contexts, _ = _stores(tmp_path, store_max_bytes_per_owner=10, context_grace_s=0)
    old = await _put(contexts, b"a" * 4)
    new = await _put(contexts, b"b" * 4)
    async with contexts.in_use([old], owner=ALICE):
        pass  # now `old` is the one used last
    assert await _put(contexts, b"a" * 4, owner=BOB) == old  # the same bytes, another owner
    latest = await _put(contexts, b"c" * 4)
    assert {i.context_id for i in await contexts.list(owner=ALICE)} == {old, latest}
    assert new not in {i.context_id for i in await contexts.list(owner=ALICE)}
    assert [i.context_id for i in await contexts.list(owner=BOB)] == [old]


async def test_eviction_takes_the_loaders_own_contexts_first(tmp_path: Path) -> None:
    contexts, _ = _stores(tmp_path, store_max_bytes=12, context_grace_s=0)
    bobs = await _put(contexts, b"b" * 5, owner=BOB)
    alices = await _put(contexts, b"a" * 5)
    latest = await _put(contexts, b"c" * 5)  # over the cap: Alice's older one goes, not Bob's
    assert [i.context_id for i in await contexts.list(owner=ALICE)] == [latest]
    assert [i.context_id for i in await contexts.list(owner=BOB)] == [bobs]
    assert alices != latest
    assert not contexts.blob_path(hashlib.sha256(b"a" * 5).hexdigest()).exists()


async def test_a_pinned_context_cannot_be_deleted_by_its_owner_and_keeps_its_bytes(tmp_path: Path) -> None:
    contexts, _ = _stores(tmp_path)
    cid = await _put(contexts, b"shared")
    theirs = await _put(contexts, b"shared", owner=BOB)
    assert theirs == cid
    async with contexts.in_use([cid], owner=ALICE) as infos:
        with pytest.raises(BadArgumentError, match="is in use by a running run"):
            await contexts.delete(cid, owner=ALICE)
        assert await contexts.delete(cid, owner=BOB)  # Bob's ownership goes; the bytes stay for the run
        assert contexts.spec(infos[0]).path.read_bytes() == b"shared"
    assert await contexts.delete(cid, owner=ALICE)
    assert not contexts.blob_path(infos[0].sha256).exists()
    assert not await contexts.delete(cid, owner=ALICE)


async def test_a_pin_of_an_unknown_id_leaves_no_pin_behind(tmp_path: Path) -> None:
    contexts, _ = _stores(tmp_path)
    cid = await _put(contexts, b"known")
    with pytest.raises(NotFoundError):
        async with contexts.in_use([cid, "ctx_unknown"], owner=ALICE):
            pass
    with sqlite3.connect(contexts.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM pins").fetchone()[0] == 0


# --- the SQLite transaction --------------------------------------------------------------------


async def test_a_statement_sent_with_the_commit_still_rolls_the_transaction_back(tmp_path: Path) -> None:
    contexts, _ = _stores(tmp_path)
    cid = await _put(contexts, b"row")
    row = (cid, "o", "n", "{}", 0.0, 0.0)
    with pytest.raises(sqlite3.IntegrityError):
        async with transaction(SqliteTx(contexts.db_path, write=True)) as tx:
            await tx.execute("UPDATE contexts SET name = 'changed' WHERE context_id = ?", (cid,))
            await tx.execute("INSERT INTO context_owners VALUES (?, ?, ?, ?, ?, ?)", row)
            await tx.execute("INSERT INTO context_owners VALUES (?, ?, ?, ?, ?, ?)", row)  # a duplicate key
    assert (await contexts.get(cid, owner=ALICE)).name == "n"
    with anyio.fail_after(DEADLINE_S):  # the lock was given back
        await _put(contexts, b"next")


async def test_more_writers_than_worker_threads_all_finish(tmp_path: Path) -> None:
    """Writers waiting for the index's lock hold shared worker threads (40 by default); the
    holder's later steps run on threads of its own, so it finishes and the queue drains."""
    contexts, _ = _stores(tmp_path)
    cid = await _put(contexts, b"busy")
    used: list[float] = []

    async def run() -> None:
        async with contexts.in_use([cid], owner=ALICE) as infos:
            used.append(infos[0].last_used_at)

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(run)
    assert len(used) == 100
    with sqlite3.connect(contexts.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM pins").fetchone()[0] == 0


async def test_a_cancelled_transaction_gives_the_lock_back(tmp_path: Path) -> None:
    contexts, _ = _stores(tmp_path)
    cid = await _put(contexts, b"row")
    entered = anyio.Event()
    with anyio.CancelScope() as scope:
        async with transaction(SqliteTx(contexts.db_path, write=True)) as tx:
            await tx.one("SELECT 1")
            await tx.execute("UPDATE contexts SET name = 'changed' WHERE context_id = ?", (cid,))
            entered.set()
            scope.cancel()
            await anyio.sleep_forever()
    assert entered.is_set()
    with anyio.fail_after(DEADLINE_S):
        assert (await contexts.get(cid, owner=ALICE)).name == "n"
        await _put(contexts, b"next")
