"""The context store: content addressing, validation, caps, list/delete, pins and eviction,
over both stores (`store_settings`: SQLite and files, then PostgreSQL)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, NotFoundError, TooLargeError
from rlm_mcp.owners import LOCAL_OWNER, Owner
from rlm_mcp.store import ContextStore
from tests.fixtures_both_stores import add_lapsed_pins, age_context, pin_count, stored_bytes
from tests.fixtures_postgres import has_bytes

pytestmark = pytest.mark.anyio
BLOBS_IN_A_BUCKET = True  # the store's rules also over bytes in a bucket (store_settings' 'bucket')

StoreSettings = Callable[..., Settings]


def _open(store_settings: StoreSettings, **overrides: object):
    # replica=True: in PostgreSQL a pin counts while its replica's heartbeat is recent.
    return make_stores(store_settings(**overrides), replica=True)


async def test_same_bytes_same_id(store_settings: StoreSettings) -> None:
    async with _open(store_settings) as stores:
        store = stores.contexts
        a = await store.put_bytes(b"hello world", name="a", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
        b = await store.put_bytes(b"hello world", name="b", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
        c = await store.put_bytes(b"hello world!", name="c", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
        sha = hashlib.sha256(b"hello world").hexdigest()
        assert a.context_id == b.context_id == f"ctx_{sha[:24]}"
        assert a.sha256 == sha and a.bytes == 11 and a.chars == 11 and a.kind == "str"
        assert c.context_id != a.context_id
        assert b.name == "b"  # the latest name describes the context
        assert len(await store.list(owner=LOCAL_OWNER)) == 2
        assert await stored_bytes(stores, sha) == b"hello world"


async def test_chars_count_code_points(store_settings: StoreSettings) -> None:
    async with _open(store_settings) as stores:
        info = await stores.contexts.put_bytes(
            "héllo €".encode(), name="u", format="text", source={}, owner=LOCAL_OWNER
        )
    assert info.chars == 7 and info.bytes == len("héllo €".encode())


async def test_json_kinds_and_id_suffix(store_settings: StoreSettings) -> None:
    async with _open(store_settings) as stores:
        store = stores.contexts
        lst = await store.put_bytes(b'[1, 2, "x"]', name="l", format="json", source={}, owner=LOCAL_OWNER)
        dct = await store.put_bytes(b'{"a": 1}', name="d", format="json", source={}, owner=LOCAL_OWNER)
        as_text = await store.put_bytes(b'[1, 2, "x"]', name="t", format="text", source={}, owner=LOCAL_OWNER)
        assert (lst.kind, dct.kind, as_text.kind) == ("list", "dict", "str")
        assert lst.context_id.endswith("_json") and not as_text.context_id.endswith("_json")
        assert lst.context_id != as_text.context_id and lst.sha256 == as_text.sha256
        # Both ids share one blob: deleting one keeps the other readable.
        assert await store.delete(as_text.context_id, owner=LOCAL_OWNER)
        async with store.in_use([lst.context_id], owner=LOCAL_OWNER) as infos:
            assert store.spec(infos[0]).path.read_bytes() == b'[1, 2, "x"]'


async def test_json_errors(store_settings: StoreSettings) -> None:
    settings = store_settings()
    async with make_stores(settings) as stores:
        store = stores.contexts
        with pytest.raises(BadArgumentError, match="not valid JSON.*format='text'"):
            await store.put_bytes(b'{"a": ', name="x", format="json", source={}, owner=LOCAL_OWNER)
        with pytest.raises(BadArgumentError, match="list or an object"):
            await store.put_bytes(b"42", name="x", format="json", source={}, owner=LOCAL_OWNER)
        assert await store.list(owner=LOCAL_OWNER) == []
    assert list((Path(settings.store.data_dir) / "tmp").iterdir()) == []  # no temp file left


async def test_invalid_utf8_refused(store_settings: StoreSettings) -> None:
    async with _open(store_settings) as stores:
        store = stores.contexts
        with pytest.raises(BadArgumentError, match="not UTF-8 text.*base64") as err:
            await store.put_bytes(b"abc\xff\xfedef", name="x", format="text", source={}, owner=LOCAL_OWNER)
        assert "offset 3" in str(err.value)
        # A multi-byte character cut off at the very end is invalid too.
        with pytest.raises(BadArgumentError):
            await store.put_bytes("é".encode()[:1], name="x", format="text", source={}, owner=LOCAL_OWNER)
        assert await store.list(owner=LOCAL_OWNER) == []


async def test_size_cap(store_settings: StoreSettings, tmp_path: Path) -> None:
    async with _open(store_settings, max_context_bytes=10) as stores:
        store = stores.contexts
        with pytest.raises(TooLargeError, match="RLM_MCP_MAX_CONTEXT_BYTES"):
            await store.put_bytes(b"x" * 11, name="x", format="text", source={}, owner=LOCAL_OWNER)
        big = tmp_path / "big.txt"
        big.write_bytes(b"y" * 11)
        with pytest.raises(TooLargeError, match="RLM_MCP_MAX_CONTEXT_BYTES"):
            await store.put_file(big, name="big", format="text", source={}, owner=LOCAL_OWNER)
        assert (await store.put_bytes(b"x" * 10, name="ok", format="text", source={}, owner=LOCAL_OWNER)).bytes == 10


async def test_put_file_streams_big_file(store_settings: StoreSettings, tmp_path: Path) -> None:
    # 3 MiB+ of 3-byte characters: chunk boundaries fall inside characters (and, in PostgreSQL,
    # the bytes span several 1 MiB chunk rows).
    text = ("€" * 1_100_000).encode()
    src = tmp_path / "big.txt"
    src.write_bytes(text)
    async with _open(store_settings) as stores:
        store = stores.contexts
        info = await store.put_file(src, name="big", format="text", source={"type": "path"}, owner=LOCAL_OWNER)
        assert info.sha256 == hashlib.sha256(text).hexdigest()
        assert info.chars == 1_100_000 and info.bytes == len(text)
        assert src.exists()  # copied, not moved
        assert await stored_bytes(stores, info.sha256) == text
        async with store.in_use([info.context_id], owner=LOCAL_OWNER) as infos:
            spec = store.spec(infos[0])
            assert spec.path.stat().st_size == len(text) and spec.kind == "str" and spec.context_id == info.context_id


async def test_put_file_consume_moves_temp(store_settings: StoreSettings) -> None:
    settings = store_settings()
    tmp = Path(settings.store.data_dir) / "tmp" / "mine.tmp"
    tmp.parent.mkdir(parents=True)
    tmp.write_bytes(b"moved in")
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_file(tmp, name="m", format="text", source={}, consume=True, owner=LOCAL_OWNER)
        assert not tmp.exists()
        assert await stored_bytes(stores, info.sha256) == b"moved in"


async def test_get_list_delete(store_settings: StoreSettings) -> None:
    async with _open(store_settings) as stores:
        store = stores.contexts
        with pytest.raises(NotFoundError, match="Unknown context id 'ctx_nope'"):
            await store.get("ctx_nope", owner=LOCAL_OWNER)
        a = await store.put_bytes(b"a", name="a", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
        assert (await store.get(a.context_id, owner=LOCAL_OWNER)).source == {"type": "text"}
        assert [i.context_id for i in await store.list(owner=LOCAL_OWNER)] == [a.context_id]
        assert await store.delete(a.context_id, owner=LOCAL_OWNER) is True
        assert await store.delete(a.context_id, owner=LOCAL_OWNER) is False
        assert not await has_bytes(stores, a.sha256)
        assert not store.spec(a).path.exists()  # PostgreSQL: this replica's cached copy went too
        assert await store.list(owner=LOCAL_OWNER) == []


async def test_in_use_pins_and_marks_used(store_settings: StoreSettings) -> None:
    async with _open(store_settings) as stores:
        store = stores.contexts
        a = await store.put_bytes(b"a", name="a", format="text", source={}, owner=LOCAL_OWNER)
        with pytest.raises(NotFoundError):
            async with store.in_use([a.context_id, "ctx_missing"], owner=LOCAL_OWNER):
                pass
        assert await pin_count(stores) == 0  # the refusal left no pin behind
        async with store.in_use([a.context_id], owner=LOCAL_OWNER) as infos:
            assert [i.context_id for i in infos] == [a.context_id]
            assert infos[0].last_used_at >= a.last_used_at
            assert await pin_count(stores) == 1
            with pytest.raises(BadArgumentError, match="in use"):
                await store.delete(a.context_id, owner=LOCAL_OWNER)
        assert await pin_count(stores) == 0
        assert await store.delete(a.context_id, owner=LOCAL_OWNER)


async def test_in_use_is_all_or_none_and_per_owner(store_settings: StoreSettings) -> None:
    """A refused pin marks nothing used either (PostgreSQL's is one statement whose writes need
    every id), the infos come in the ids' order, and another owner's context is unknown."""
    async with _open(store_settings) as stores:
        store = stores.contexts
        a = await store.put_bytes(b"a", name="a", format="text", source={}, owner=LOCAL_OWNER)
        b = await store.put_bytes(b"b", name="b", format="text", source={}, owner=LOCAL_OWNER)
        aged = (await store.get(a.context_id, owner=LOCAL_OWNER)).last_used_at
        missing = "ctx_" + "0" * 24  # well formed, not stored
        with pytest.raises(NotFoundError, match=missing):
            async with store.in_use([a.context_id, missing], owner=LOCAL_OWNER):
                pass
        assert await pin_count(stores) == 0
        assert (await store.get(a.context_id, owner=LOCAL_OWNER)).last_used_at == aged
        with pytest.raises(NotFoundError):
            async with store.in_use([a.context_id], owner=Owner("someone-else")):
                pass
        assert await pin_count(stores) == 0
        async with store.in_use([b.context_id, a.context_id], owner=LOCAL_OWNER) as infos:
            assert [i.context_id for i in infos] == [b.context_id, a.context_id]
            assert infos[1].last_used_at > aged
            assert (await store.get(a.context_id, owner=LOCAL_OWNER)).last_used_at == infos[1].last_used_at
            assert await pin_count(stores) == 2
        assert await pin_count(stores) == 0


async def test_eviction_lru_by_size(store_settings: StoreSettings) -> None:
    async with _open(store_settings, store_max_bytes=250, context_grace_s=0) as stores:
        store = stores.contexts
        a = await store.put_bytes(b"a" * 100, name="a", format="text", source={}, owner=LOCAL_OWNER)
        b = await store.put_bytes(b"b" * 100, name="b", format="text", source={}, owner=LOCAL_OWNER)
        await age_context(stores, a.context_id, 20)
        await age_context(stores, b.context_id, 10)
        async with store.in_use([a.context_id], owner=LOCAL_OWNER):
            pass  # a is now the most recently used
        c = await store.put_bytes(b"c" * 100, name="c", format="text", source={}, owner=LOCAL_OWNER)
        ids = {i.context_id for i in await store.list(owner=LOCAL_OWNER)}
        assert ids == {a.context_id, c.context_id}
        assert not await has_bytes(stores, b.sha256)


async def test_eviction_by_age_skips_pinned(store_settings: StoreSettings) -> None:
    async with _open(store_settings, store_max_age_days=1) as stores:
        store = stores.contexts
        old = await store.put_bytes(b"old", name="old", format="text", source={}, owner=LOCAL_OWNER)
        pinned = await store.put_bytes(b"pinned", name="p", format="text", source={}, owner=LOCAL_OWNER)
        fresh = await store.put_bytes(b"fresh", name="f", format="text", source={}, owner=LOCAL_OWNER)
        async with store.in_use([pinned.context_id], owner=LOCAL_OWNER):
            await age_context(stores, old.context_id, 3 * 86400)
            await age_context(stores, pinned.context_id, 3 * 86400)
            assert await store.evict() == [old.context_id]
        await age_context(stores, pinned.context_id, 3 * 86400)
        assert await store.evict() == [pinned.context_id]
        assert [i.context_id for i in await store.list(owner=LOCAL_OWNER)] == [fresh.context_id]


async def test_a_lapsed_pin_is_ignored(store_settings: StoreSettings) -> None:
    # SQLite: a pin of a dead process on this host, one of another host past its expiry.
    # PostgreSQL: a pin of a replica whose heartbeat stopped, one of this replica past its expiry.
    async with _open(store_settings, store_max_age_days=1) as stores:
        store = stores.contexts
        a = await store.put_bytes(b"a", name="a", format="text", source={}, owner=LOCAL_OWNER)
        await add_lapsed_pins(stores, a.context_id)
        assert await pin_count(stores) == 2
        await age_context(stores, a.context_id, 3 * 86400)
        assert await store.evict() == [a.context_id]
        assert await pin_count(stores) == 0


async def test_new_context_kept_even_if_over_cap(store_settings: StoreSettings) -> None:
    async with _open(store_settings, store_max_bytes=5) as stores:
        info = await stores.contexts.put_bytes(b"0123456789", name="big", format="text", source={}, owner=LOCAL_OWNER)
        assert (await stores.contexts.get(info.context_id, owner=LOCAL_OWNER)).bytes == 10


async def test_a_data_dir_made_again_at_the_same_path_gets_fresh_connections(tmp_path: Path) -> None:
    # SQLite only: its idle index connections are reused, and one still open on a deleted index
    # must not be lent (PostgreSQL's connections do not depend on the data dir).
    data = tmp_path / "data"
    first = ContextStore(Settings(data_dir=data).store)
    old = await first.put_bytes(b"old", name="old", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    shutil.rmtree(data)
    second = ContextStore(Settings(data_dir=data).store)
    new = await second.put_bytes(b"new", name="new", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    assert [c.context_id for c in await second.list(owner=LOCAL_OWNER)] == [new.context_id]
    assert old.context_id != new.context_id
