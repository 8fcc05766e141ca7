"""The embedded store's context read (`ContextStore.get`: a run's admission waits for it) is done
on the event loop, with no worker-thread hop, whenever it cannot wait; when SQLite would have to
wait for a lock it goes to a worker thread as before, and the event loop never waits on the
busy handler."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store import ContextStore, _db
from rlm_mcp.testing.settings import make_settings

T = TypeVar("T")


def _count_hops(monkeypatch: pytest.MonkeyPatch, before: Callable[[], None] = lambda: None) -> list[str]:
    """Every worker-thread hop, whoever asks (`before` runs on the loop as each one is asked for)."""
    hops: list[str] = []
    real = anyio.to_thread.run_sync

    async def counted(func: Callable[[], T], *args: object, **kwargs: object) -> T:
        hops.append(getattr(func, "__name__", "?"))
        before()
        return await real(func, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    return hops


def test_a_context_is_read_without_a_thread_hop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ContextStore(make_settings(tmp_path).store)

    async def run() -> tuple[str, list[str]]:
        info = await store.put_bytes(b"hello", name="n", format="text", source={}, owner=LOCAL_OWNER)
        hops = _count_hops(monkeypatch)
        got = await store.get(info.context_id, owner=LOCAL_OWNER)
        assert got.context_id == info.context_id and got.bytes == 5
        return got.name or "", hops

    name, hops = anyio.run(run)
    assert name == "n"
    assert hops == []


def test_the_loop_read_never_waits_for_a_lock(tmp_path: Path) -> None:
    """While it reads, the connection's busy timeout is 0: a lock another connection holds is
    answered at once (the caller then reads in a worker thread), never by the busy handler."""
    store = ContextStore(make_settings(tmp_path).store)
    seen: list[int] = []

    def write_in_read(conn: sqlite3.Connection) -> None:
        seen.append(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        conn.execute("BEGIN IMMEDIATE")  # what would wait: the write lock the other connection holds

    async def run() -> tuple[object, object]:
        info = await store.put_bytes(b"hello", name="n", format="text", source={}, owner=LOCAL_OWNER)
        other = sqlite3.connect(store.db_path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            refused = _db.read_here(store.db_path, write_in_read)
            other.execute("ROLLBACK")
        finally:
            other.close()
        # The refused connection was closed: a worker thread's read puts one back in the pool, the
        # next read takes it on the loop and gives it back.
        await store.get(info.context_id, owner=LOCAL_OWNER)
        await store.get(info.context_id, owner=LOCAL_OWNER)
        with _db.connect(store.db_path) as conn:  # the same idle connection, lent to a worker thread's operation
            after = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        return refused, after

    refused, after = anyio.run(run)
    assert seen == [0]
    assert refused is None  # would wait: the caller's to read it in a worker thread
    assert after == _db.BUSY_TIMEOUT_MS  # a connection lent again waits as every other one does


def test_a_read_that_would_wait_goes_to_a_worker_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ContextStore(make_settings(tmp_path).store)

    async def run() -> tuple[int, list[str]]:
        info = await store.put_bytes(b"hello", name="n", format="text", source={}, owner=LOCAL_OWNER)
        monkeypatch.setattr(_db, "read_here", lambda path, work: None)
        hops = _count_hops(monkeypatch)
        got = await store.get(info.context_id, owner=LOCAL_OWNER)
        return got.bytes, hops

    size, hops = anyio.run(run)
    assert size == 5
    assert len(hops) == 1
