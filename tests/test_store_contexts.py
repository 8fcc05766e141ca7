"""ContextStore: content addressing, validation, caps, list/delete, pins and eviction."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, NotFoundError, TooLargeError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store import ContextStore

pytestmark = pytest.mark.anyio


async def test_same_bytes_same_id(settings) -> None:
    store = ContextStore(settings)
    a = await store.put_bytes(b"hello world", name="a", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    b = await store.put_bytes(b"hello world", name="b", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    c = await store.put_bytes(b"hello world!", name="c", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    sha = hashlib.sha256(b"hello world").hexdigest()
    assert a.context_id == b.context_id == f"ctx_{sha[:24]}"
    assert a.sha256 == sha and a.bytes == 11 and a.chars == 11 and a.kind == "str"
    assert c.context_id != a.context_id
    assert b.name == "b"  # the latest name describes the context
    assert len(await store.list(owner=LOCAL_OWNER)) == 2
    assert store.blob_path(sha).read_bytes() == b"hello world"


async def test_chars_count_code_points(settings) -> None:
    info = await ContextStore(settings).put_bytes(
        "héllo €".encode(), name="u", format="text", source={}, owner=LOCAL_OWNER
    )
    assert info.chars == 7 and info.bytes == len("héllo €".encode())


async def test_json_kinds_and_id_suffix(settings) -> None:
    store = ContextStore(settings)
    lst = await store.put_bytes(b'[1, 2, "x"]', name="l", format="json", source={}, owner=LOCAL_OWNER)
    dct = await store.put_bytes(b'{"a": 1}', name="d", format="json", source={}, owner=LOCAL_OWNER)
    as_text = await store.put_bytes(b'[1, 2, "x"]', name="t", format="text", source={}, owner=LOCAL_OWNER)
    assert (lst.kind, dct.kind, as_text.kind) == ("list", "dict", "str")
    assert lst.context_id.endswith("_json") and not as_text.context_id.endswith("_json")
    assert lst.context_id != as_text.context_id and lst.sha256 == as_text.sha256
    # Both ids share one blob: deleting one keeps the other readable.
    assert await store.delete(as_text.context_id, owner=LOCAL_OWNER)
    assert store.spec(lst).path.read_bytes() == b'[1, 2, "x"]'


async def test_json_errors(settings) -> None:
    store = ContextStore(settings)
    with pytest.raises(BadArgumentError, match="not valid JSON.*format='text'"):
        await store.put_bytes(b'{"a": ', name="x", format="json", source={}, owner=LOCAL_OWNER)
    with pytest.raises(BadArgumentError, match="list or an object"):
        await store.put_bytes(b"42", name="x", format="json", source={}, owner=LOCAL_OWNER)
    assert await store.list(owner=LOCAL_OWNER) == []
    assert list((Path(settings.data_dir) / "tmp").iterdir()) == []  # no temp file left


async def test_invalid_utf8_refused(settings) -> None:
    store = ContextStore(settings)
    with pytest.raises(BadArgumentError, match="not UTF-8 text.*base64") as err:
        await store.put_bytes(b"abc\xff\xfedef", name="x", format="text", source={}, owner=LOCAL_OWNER)
    assert "offset 3" in str(err.value)
    # A multi-byte character cut off at the very end is invalid too.
    with pytest.raises(BadArgumentError):
        await store.put_bytes("é".encode()[:1], name="x", format="text", source={}, owner=LOCAL_OWNER)


async def test_size_cap(settings_factory, tmp_path) -> None:
    store = ContextStore(settings_factory(max_context_bytes=10))
    with pytest.raises(TooLargeError, match="RLM_MCP_MAX_CONTEXT_BYTES"):
        await store.put_bytes(b"x" * 11, name="x", format="text", source={}, owner=LOCAL_OWNER)
    big = tmp_path / "big.txt"
    big.write_bytes(b"y" * 11)
    with pytest.raises(TooLargeError, match="RLM_MCP_MAX_CONTEXT_BYTES"):
        await store.put_file(big, name="big", format="text", source={}, owner=LOCAL_OWNER)
    assert (await store.put_bytes(b"x" * 10, name="ok", format="text", source={}, owner=LOCAL_OWNER)).bytes == 10


async def test_put_file_streams_big_file(settings, tmp_path) -> None:
    # 3 MiB+ of 3-byte characters: chunk boundaries fall inside characters.
    text = ("€" * 1_100_000).encode()
    src = tmp_path / "big.txt"
    src.write_bytes(text)
    store = ContextStore(settings)
    info = await store.put_file(src, name="big", format="text", source={"type": "path"}, owner=LOCAL_OWNER)
    assert info.sha256 == hashlib.sha256(text).hexdigest()
    assert info.chars == 1_100_000 and info.bytes == len(text)
    assert src.exists()  # copied, not moved
    spec = store.spec(info)
    assert spec.path.stat().st_size == len(text) and spec.kind == "str" and spec.context_id == info.context_id


async def test_put_file_consume_moves_temp(settings) -> None:
    store = ContextStore(settings)
    tmp = Path(settings.data_dir) / "tmp" / "mine.tmp"
    tmp.parent.mkdir(parents=True)
    tmp.write_bytes(b"moved in")
    info = await store.put_file(tmp, name="m", format="text", source={}, consume=True, owner=LOCAL_OWNER)
    assert not tmp.exists()
    assert store.spec(info).path.read_bytes() == b"moved in"


async def test_get_list_delete(settings) -> None:
    store = ContextStore(settings)
    with pytest.raises(NotFoundError, match="Unknown context id 'ctx_nope'"):
        await store.get("ctx_nope", owner=LOCAL_OWNER)
    a = await store.put_bytes(b"a", name="a", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    assert (await store.get(a.context_id, owner=LOCAL_OWNER)).source == {"type": "text"}
    assert [i.context_id for i in await store.list(owner=LOCAL_OWNER)] == [a.context_id]
    assert await store.delete(a.context_id, owner=LOCAL_OWNER) is True
    assert await store.delete(a.context_id, owner=LOCAL_OWNER) is False
    assert not store.blob_path(a.sha256).exists()
    assert await store.list(owner=LOCAL_OWNER) == []


async def test_in_use_pins_and_marks_used(settings) -> None:
    store = ContextStore(settings)
    a = await store.put_bytes(b"a", name="a", format="text", source={}, owner=LOCAL_OWNER)
    with pytest.raises(NotFoundError):
        async with store.in_use([a.context_id, "ctx_missing"], owner=LOCAL_OWNER):
            pass
    async with store.in_use([a.context_id], owner=LOCAL_OWNER) as infos:
        assert [i.context_id for i in infos] == [a.context_id]
        assert infos[0].last_used_at >= a.last_used_at
        with pytest.raises(BadArgumentError, match="in use"):
            await store.delete(a.context_id, owner=LOCAL_OWNER)
    assert _pin_count(store) == 0
    assert await store.delete(a.context_id, owner=LOCAL_OWNER)


PIN_ROW = "INSERT INTO pins (pin_id, context_id, host, pid, proc_start, expires_at) "


def _pin_count(store: ContextStore) -> int:
    with sqlite3.connect(store.db_path) as conn:
        return conn.execute("SELECT COUNT(*) FROM pins").fetchone()[0]


def _age(store: ContextStore, context_id: str, seconds: float) -> None:
    with sqlite3.connect(store.db_path) as conn:
        conn.execute("UPDATE contexts SET last_used_at = ? WHERE context_id = ?", (time.time() - seconds, context_id))


async def test_eviction_lru_by_size(settings_factory) -> None:
    store = ContextStore(settings_factory(store_max_bytes=250, context_grace_s=0))
    a = await store.put_bytes(b"a" * 100, name="a", format="text", source={}, owner=LOCAL_OWNER)
    b = await store.put_bytes(b"b" * 100, name="b", format="text", source={}, owner=LOCAL_OWNER)
    _age(store, a.context_id, 20)
    _age(store, b.context_id, 10)
    async with store.in_use([a.context_id], owner=LOCAL_OWNER):
        pass  # a is now the most recently used
    c = await store.put_bytes(b"c" * 100, name="c", format="text", source={}, owner=LOCAL_OWNER)
    ids = {i.context_id for i in await store.list(owner=LOCAL_OWNER)}
    assert ids == {a.context_id, c.context_id}
    assert not store.blob_path(b.sha256).exists()


async def test_eviction_by_age_skips_pinned(settings_factory) -> None:
    store = ContextStore(settings_factory(store_max_age_days=1))
    old = await store.put_bytes(b"old", name="old", format="text", source={}, owner=LOCAL_OWNER)
    pinned = await store.put_bytes(b"pinned", name="p", format="text", source={}, owner=LOCAL_OWNER)
    fresh = await store.put_bytes(b"fresh", name="f", format="text", source={}, owner=LOCAL_OWNER)
    async with store.in_use([pinned.context_id], owner=LOCAL_OWNER):
        _age(store, old.context_id, 3 * 86400)
        _age(store, pinned.context_id, 3 * 86400)
        assert await store.evict() == [old.context_id]
    _age(store, pinned.context_id, 3 * 86400)
    assert await store.evict() == [pinned.context_id]
    assert [i.context_id for i in await store.list(owner=LOCAL_OWNER)] == [fresh.context_id]


async def test_pin_of_dead_process_is_ignored(settings_factory) -> None:
    store = ContextStore(settings_factory(store_max_age_days=1))
    a = await store.put_bytes(b"a", name="a", format="text", source={}, owner=LOCAL_OWNER)
    dead_pid = _dead_pid()
    from rlm_mcp.store import _db

    with sqlite3.connect(store.db_path) as conn:
        conn.execute(PIN_ROW + "VALUES ('p', ?, ?, ?, NULL, ?)", (a.context_id, _db.HOST, dead_pid, time.time() + 999))
        conn.execute(PIN_ROW + "VALUES ('q', ?, 'other-host', 1, NULL, ?)", (a.context_id, time.time() - 1))
    _age(store, a.context_id, 3 * 86400)
    assert await store.evict() == [a.context_id]
    assert _pin_count(store) == 0


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def test_new_context_kept_even_if_over_cap(settings_factory) -> None:
    store = ContextStore(settings_factory(store_max_bytes=5))
    info = await store.put_bytes(b"0123456789", name="big", format="text", source={}, owner=LOCAL_OWNER)
    assert (await store.get(info.context_id, owner=LOCAL_OWNER)).bytes == 10


async def test_a_data_dir_made_again_at_the_same_path_gets_fresh_connections(tmp_path: Path) -> None:
    # Idle index connections are reused; one still open on a deleted index must not be lent.
    data = tmp_path / "data"
    first = ContextStore(Settings(data_dir=data))
    old = await first.put_bytes(b"old", name="old", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    shutil.rmtree(data)
    second = ContextStore(Settings(data_dir=data))
    new = await second.put_bytes(b"new", name="new", format="text", source={"type": "text"}, owner=LOCAL_OWNER)
    assert [c.context_id for c in await second.list(owner=LOCAL_OWNER)] == [new.context_id]
    assert old.context_id != new.context_id
