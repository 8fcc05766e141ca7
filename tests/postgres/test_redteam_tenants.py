"""Tenants of one server (reliability and security round four): with several tokens each owner
has a share of the context store by default, derived from the store's cap and the number of
tokens, so one owner's loads never push out another owner's contexts; the start log and
`doctor` say what the share is. Both stores (`store_settings`: SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.doctor import _owner_share
from rlm_mcp.errors import TooLargeError
from rlm_mcp.owners import Owner
from rlm_mcp.server.start_checks import shares_for_owners
from rlm_mcp.store.bundle import Stores
from tests.fixtures_both_stores import age_context, stored_bytes
from tests.fixtures_store import make_settings

pytestmark = pytest.mark.anyio
BLOBS_IN_A_BUCKET = True  # the store's rules also over bytes in a bucket (store_settings' 'bucket')

ALICE, BOB = Owner("token-alice"), Owner("token-bob")


async def _put(stores: Stores, data: bytes, name: str, owner: Owner) -> Any:
    return await stores.contexts.put_bytes(data, name=name, format="text", source={}, owner=owner)


async def test_with_several_tokens_one_owners_loads_never_evict_anothers(store_settings, caplog) -> None:
    """Bob's context is past the grace window, Alice's are within it (protected); before, her
    second load made the store evict Bob's context ("Unknown context id" for him). Now her
    share (1000 / 2 tokens) refuses it, and Bob keeps his."""
    settings = store_settings(store_max_bytes=1000, context_grace_s=900)
    with caplog.at_level(logging.INFO, logger="rlm_mcp.server"):
        served = shares_for_owners(settings, ["alice", "bob"])
    assert served.store.store_max_bytes_per_owner == 500
    assert "500 bytes per owner: RLM_MCP_STORE_MAX_BYTES (1000 bytes) / 2 tokens" in caplog.text
    async with make_stores(served) as stores:
        bob = await _put(stores, b"b" * 400, "bob's", BOB)
        await age_context(stores, bob.context_id, 3600)
        await _put(stores, b"1" * 400, "a1", ALICE)
        with pytest.raises(TooLargeError) as refused:
            await _put(stores, b"2" * 400, "a2", ALICE)
        assert "bob" not in str(refused.value).lower()  # the refusal speaks of Alice's bytes only
        assert (await stores.contexts.get(bob.context_id, owner=BOB)).name == "bob's"


async def test_without_the_share_the_same_loads_evict_the_other_owner(store_settings) -> None:
    """Positive control: the store's cap alone (one token's default) does push Bob out."""
    settings = shares_for_owners(store_settings(store_max_bytes=1000, context_grace_s=900), ["alice"])
    assert settings.store.store_max_bytes_per_owner is None
    async with make_stores(settings) as stores:
        bob = await _put(stores, b"b" * 400, "bob's", BOB)
        await age_context(stores, bob.context_id, 3600)
        await _put(stores, b"1" * 400, "a1", ALICE)
        await _put(stores, b"2" * 400, "a2", ALICE)
        assert [c.name for c in await stores.contexts.list(owner=BOB)] == []


async def test_a_share_set_on_purpose_stands_and_doctor_says_which(tmp_path) -> None:
    chosen = make_settings(tmp_path, auth_tokens=["a", "b", "c"], store_max_bytes_per_owner=123)
    assert shares_for_owners(chosen, ["a", "b", "c"]).store.store_max_bytes_per_owner == 123
    assert (await _owner_share(chosen)).detail == "123 bytes per owner (RLM_MCP_STORE_MAX_BYTES_PER_OWNER)"
    derived = make_settings(tmp_path, auth_tokens=["a", "b", "c", "d"], store_max_bytes=20 << 30)
    row = await _owner_share(derived)
    assert row.ok and row.detail.startswith("5 GiB per owner: RLM_MCP_STORE_MAX_BYTES (20 GiB) / 4 tokens")
    assert (await _owner_share(make_settings(tmp_path, auth_token="one"))).detail.startswith("none: one owner")


async def _chunk_rows(stores: Stores, sha256: str) -> list[int]:
    """The chunk indexes stored for a blob (every copy's)."""
    from rlm_mcp.store.pg import Database

    assert isinstance(stores.lifecycle, Database)
    async with stores.lifecycle.connection() as conn:
        cur = await conn.execute("SELECT idx FROM rlm_blob_chunks WHERE sha256 = %s ORDER BY idx", (sha256,))
        return [r["idx"] for r in await cur.fetchall()]


@pytest.mark.postgres
async def test_team_mode_deduplicates_within_an_owner_only(tmp_path, pg_migrated_url: str) -> None:
    """Each owner's load of bytes writes blob rows of its own (so it costs what a load of new
    bytes costs, and tells nothing); a load of bytes the owner holds writes none (control); an
    owner letting go removes its copy, never the one the others read."""
    data = secrets.token_hex(5 << 19).encode()  # 5 MiB: five chunk rows a copy
    settings = make_settings(tmp_path, database_url=pg_migrated_url)
    stride = 1 << 20
    copy0, copy1 = list(range(5)), [stride + i for i in range(5)]
    async with make_stores(settings) as stores:
        alice = await _put(stores, data, "alice's", ALICE)
        assert await _chunk_rows(stores, alice.sha256) == copy0
        await _put(stores, data, "alice's again", ALICE)
        assert await _chunk_rows(stores, alice.sha256) == copy0  # her own bytes: nothing written
        bob = await _put(stores, data, "bob's", BOB)
        assert bob.sha256 == alice.sha256 and bob.context_id == alice.context_id
        assert await _chunk_rows(stores, bob.sha256) == copy0 + copy1  # Bob's load wrote his own rows
        await _put(stores, data, "bob's again", BOB)
        assert await _chunk_rows(stores, bob.sha256) == copy0 + copy1
        assert await stored_bytes(stores, bob.sha256) == data
        # Alice lets go: one holder is left, one copy; Bob still reads his bytes from it.
        assert await stores.contexts.delete(alice.context_id, owner=ALICE)
        assert await _chunk_rows(stores, bob.sha256) == copy0
        async with stores.contexts.in_use([bob.context_id], owner=BOB) as infos:
            assert stores.contexts.spec(infos[0]).path.read_bytes() == data
        carol = await _put(stores, data, "carol's", Owner("token-carol"))
        assert await _chunk_rows(stores, carol.sha256) == copy0 + copy1
        assert await stores.contexts.delete(bob.context_id, owner=BOB)
        assert await stores.contexts.delete(carol.context_id, owner=Owner("token-carol"))
        assert await _chunk_rows(stores, carol.sha256) == []  # nobody holds it: gone
