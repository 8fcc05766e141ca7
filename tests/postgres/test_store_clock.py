"""One clock for team mode's store: two replicas (two store bundles, separate data dirs, one
database) where one replica's own clock is off by more than a day (its instances' `clock`,
not the test's global time). Contexts' times (eviction by age, LRU order, grace), unfinished
uploads' ages and spent codes' expiry are judged by the database's clock, so the skewed replica
and the other agree; run records are aged by it too."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.owners import Owner
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.pg.contexts import PgContextStore
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.spent_codes import SpentCodes
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

ALICE = Owner("token-alice")
SKEW_S = 30 * 3600  # past a day: past the uploads' lifetime and the age cap below


def _replica(tmp_path: Path, name: str, url: str, **overrides: Any) -> Stores:
    settings = make_settings(tmp_path, data_dir=tmp_path / name, database_url=url, **overrides)
    return make_stores(settings, replica=True)


def _skewed(by: float) -> Callable[[], float]:
    return lambda: time.time() + by


def _skew(stores: Stores, by: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Set this replica's own clock `by` seconds off: every clock its store instances read."""
    assert isinstance(stores.contexts, PgContextStore)
    monkeypatch.setattr(stores.contexts.index, "clock", _skewed(by))
    assert isinstance(stores.spent_codes, SpentCodes)
    monkeypatch.setattr(stores.spent_codes, "clock", _skewed(by))


async def _ids(stores: Stores) -> set[str]:
    return {i.context_id for i in await stores.contexts.list(owner=ALICE)}


@pytest.mark.parametrize("skew", [-SKEW_S, SKEW_S], ids=["behind", "ahead"])
async def test_contexts_loaded_on_either_replica_are_not_evicted_by_age(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """Contexts unused for a day are evicted: none stored just now is, whichever replica stored
    it and whichever evicts (each store evicts after it stores)."""
    async with (
        _replica(tmp_path, "a", pg_url, store_max_age_days=1.0) as a,
        _replica(tmp_path, "b", pg_url, store_max_age_days=1.0) as b,
    ):
        _skew(b, skew, monkeypatch)
        on_b = await b.contexts.put_bytes(b"stored on b", name="b", format="text", source={}, owner=ALICE)
        on_a = await a.contexts.put_bytes(b"stored on a", name="a", format="text", source={}, owner=ALICE)
        again = await b.contexts.put_bytes(b"on b again", name="b2", format="text", source={}, owner=ALICE)
        assert await a.contexts.evict() == [] and await b.contexts.evict() == []
        assert await _ids(a) == {on_b.context_id, on_a.context_id, again.context_id}
        assert abs(on_b.created_at - on_a.created_at) < 600  # both stamped by the one clock


@pytest.mark.parametrize("skew", [-SKEW_S, SKEW_S], ids=["behind", "ahead"])
async def test_contexts_within_the_grace_period_stay_whichever_replica_stored_them(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """Over the cap, a context stored within RLM_MCP_CONTEXT_GRACE_S is kept (the store may go
    over its cap a while): on either replica, whichever stored it."""
    async with (
        _replica(tmp_path, "a", pg_url, store_max_bytes=150) as a,
        _replica(tmp_path, "b", pg_url, store_max_bytes=150) as b,
    ):
        _skew(b, skew, monkeypatch)
        stored = []
        for n, stores in enumerate([a, b, a]):
            info = await stores.contexts.put_bytes(
                bytes([65 + n]) * 100, name=str(n), format="text", source={}, owner=ALICE
            )
            stored.append(info.context_id)
        assert await _ids(a) == set(stored)


# A clock behind makes what the skewed replica stores look older, one ahead newer: it stores
# the context that looks older (behind: the second) or newer (ahead: the first) than it is.
@pytest.mark.parametrize(("skew", "stored_on_b"), [(-SKEW_S, 1), (SKEW_S, 0)], ids=["behind", "ahead"])
async def test_least_recently_used_is_judged_by_one_clock(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, skew: float, stored_on_b: int
) -> None:
    """Over the cap, the context used longest ago goes, whichever replica stored it and when."""
    async with (
        _replica(tmp_path, "a", pg_url, store_max_bytes=250, context_grace_s=0.0) as a,
        _replica(tmp_path, "b", pg_url, store_max_bytes=250, context_grace_s=0.0) as b,
    ):
        _skew(b, skew, monkeypatch)
        stored = []
        for n in range(3):
            stores = b if n == stored_on_b else a
            info = await stores.contexts.put_bytes(
                bytes([48 + n]) * 100, name=str(n), format="text", source={}, owner=ALICE
            )
            stored.append(info.context_id)
        assert await _ids(a) == await _ids(b) == {stored[1], stored[2]}  # the first went


@pytest.mark.parametrize("skew", [-SKEW_S, SKEW_S], ids=["behind", "ahead"])
async def test_an_upload_moving_between_replicas_keeps_its_age(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """Uploads untouched for a day expire: one whose chunks alternate between the skewed replica
    and the other is never taken for expired on either."""
    parts = [b"first, ", b"second, ", b"third, ", b"last"]
    async with _replica(tmp_path, "a", pg_url) as a, _replica(tmp_path, "b", pg_url) as b:
        _skew(b, skew, monkeypatch)
        upload_id = None
        for index, (part, stores) in enumerate(zip(parts, [b, a, b, a], strict=True)):
            state = await stores.uploads.put_chunk(
                data=part,
                index=index,
                upload_id=upload_id,
                final=index == len(parts) - 1,
                sha256=None,
                name="moving",
                format=None,
                owner=ALICE,
            )
            upload_id = state.upload_id
        assert state.done and state.context is not None
        assert state.context.bytes == sum(len(p) for p in parts)


async def test_a_spent_code_stays_spent_on_both_replicas(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose clock runs a day ahead forgets no code the others still take."""
    async with _replica(tmp_path, "a", pg_url) as a, _replica(tmp_path, "b", pg_url) as b:
        _skew(b, SKEW_S, monkeypatch)
        expires = time.time() + 60
        assert await a.spent_codes.spend("code-one", expires) is True
        assert await b.spent_codes.spend("code-two", expires) is True  # b sweeps expired codes first
        assert await a.spent_codes.spend("code-one", expires) is False
        assert await b.spent_codes.spend("code-one", expires) is False
        assert await a.spent_codes.spend("code-two", expires) is False


@pytest.mark.parametrize("skew", [-SKEW_S, SKEW_S], ids=["behind", "ahead"])
async def test_run_records_from_a_skewed_replica_are_not_pruned_early(tmp_path: Path, pg_url: str, skew: float) -> None:
    """A record whose creation the skewed replica stamped by its own clock is aged by the
    database's: neither replica prunes it a day early. (Already so before the store's clock
    moved to the database: record ages were the database's.)"""
    async with _replica(tmp_path, "a", pg_url) as a, _replica(tmp_path, "b", pg_url) as b:
        done = {"status": "completed", "owner": ALICE, "result": {"status": "completed"}}
        log = await b.runs.create(run_record("run_skewed_000000001", {"owner": ALICE}, created_at=time.time() + skew))
        await log.write_summary(run_record("run_skewed_000000001", done, created_at=time.time() + skew))
        assert await a.runs.prune(max_records=100, max_age_days=1.0) == []
        assert await b.runs.prune(max_records=100, max_age_days=1.0) == []
        assert [r.run_id for r in await a.runs.list(owner=ALICE)] == ["run_skewed_000000001"]


async def test_a_clocked_transaction_reads_one_time_and_rolls_back_when_it_raises(tmp_path: Path, pg_url: str) -> None:
    """The database's time comes with the BEGIN and holds for the whole transaction; a block that
    raises leaves nothing behind and gives back a connection the next transaction can use."""
    async with _replica(tmp_path, "a", pg_url) as a:
        db = a.lifecycle
        assert isinstance(db, Database)
        with pytest.raises(RuntimeError, match="refused"):
            async with db.clocked_transaction() as (conn, now):
                await conn.execute("INSERT INTO rlm_spent_codes VALUES ('left-behind', 0)")
                cur = await conn.execute("SELECT extract(epoch FROM now())::float8 AS t")
                assert (await cur.fetchone() or {})["t"] == now
                assert abs(now - time.time()) < 600
                raise RuntimeError("refused")
        assert isinstance(a.contexts, PgContextStore)
        async with a.contexts.index.read() as tx:  # a read asks when it needs the time
            assert abs(await tx.now() - now) < 600
        for _ in range(2):  # the connections given back are clean
            async with db.clocked_transaction() as (conn, _now):
                cur = await conn.execute("SELECT count(*) AS n FROM rlm_spent_codes WHERE code_sha256 = 'left-behind'")
                assert (await cur.fetchone() or {})["n"] == 0
