"""A context is not evicted under a caller's feet (issue 14 item 10): freshly stored contexts are
protected for RLM_MCP_CONTEXT_GRACE_S and pinned ones while their run lives, by every server
process sharing the data dir. The other server here is a real second process; in team mode,
another replica on the same database."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import signal
import sqlite3
import time
from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store import ContextStore
from rlm_mcp.store.bundle import Stores
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_both_stores import age_context

CAP = 1000


def _settings(data_dir: str, grace_s: float) -> Settings:
    return Settings(
        data_dir=Path(data_dir), allowed_roots=[Path(data_dir)], store_max_bytes=CAP, context_grace_s=grace_s
    )


def _store_one(data_dir: str, grace_s: float, queue: multiprocessing.Queue) -> None:
    async def main() -> None:
        info = await ContextStore(_settings(data_dir, grace_s).store).put_bytes(
            b"x" * 800, name="loaded by the other server", format="text", source={}, owner=LOCAL_OWNER
        )
        queue.put(info.context_id)

    anyio.run(main)


def _hold_pin(
    data_dir: str,
    context_id: str,
    pinned: multiprocessing.synchronize.Event,
    release: multiprocessing.synchronize.Event,
) -> None:
    async def main() -> None:
        async with ContextStore(_settings(data_dir, 0).store).in_use([context_id], owner=LOCAL_OWNER):
            pinned.set()
            await anyio.to_thread.run_sync(lambda: release.wait(120))

    anyio.run(main)


def _in_other_process(target, *args) -> str:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    return str(queue.get(timeout=5))


def _age(store: ContextStore, context_id: str, seconds: float) -> None:
    with sqlite3.connect(store.db_path) as conn:
        conn.execute("UPDATE contexts SET last_used_at = ? WHERE context_id = ?", (time.time() - seconds, context_id))


@pytest.mark.parametrize(("grace_s", "kept"), [(600.0, True), (0.0, False)])
def test_a_context_another_process_just_stored_survives_eviction(tmp_path: Path, grace_s: float, kept: bool) -> None:
    data_dir = str(tmp_path / "data")
    theirs = _in_other_process(_store_one, data_dir, grace_s)

    async def main() -> None:
        store = ContextStore(_settings(data_dir, grace_s).store)
        await store.put_bytes(
            b"y" * 800, name="mine", format="text", source={}, owner=LOCAL_OWNER
        )  # over the cap: evicts
        ids = {i.context_id for i in await store.list(owner=LOCAL_OWNER)}
        assert (theirs in ids) is kept
        if kept:  # the caller's rlm_complete can still pin and read it
            async with store.in_use([theirs], owner=LOCAL_OWNER) as infos:
                assert store.spec(infos[0]).path.read_bytes() == b"x" * 800

    anyio.run(main)


def test_a_context_pinned_by_another_process_survives_until_released_or_dead(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    settings = _settings(data_dir, 0)
    store = ContextStore(settings.store)
    info = anyio.run(lambda: store.put_bytes(b"z" * 800, name="held", format="text", source={}, owner=LOCAL_OWNER))
    ctx = multiprocessing.get_context("spawn")
    for ending in ("release", "kill"):
        pinned, release = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_hold_pin, args=(data_dir, info.context_id, pinned, release))
        proc.start()
        try:
            assert pinned.wait(60)
            _age(store, info.context_id, 10 * 86400)
            assert anyio.run(
                lambda: store.put_bytes(b"w" * 800, name="pressure", format="text", source={}, owner=LOCAL_OWNER)
            )
            assert info.context_id in {i.context_id for i in anyio.run(lambda: store.list(owner=LOCAL_OWNER))}
            if ending == "release":
                release.set()
                proc.join(60)
                assert proc.exitcode == 0
            else:
                assert proc.pid is not None
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(60)
        finally:
            if proc.is_alive():  # a failed assertion above: never leave the helper behind
                proc.kill()
            proc.join(60)
        more = b"v" * 800 + ending.encode()
        anyio.run(lambda: store.put_bytes(more, name="more", format="text", source={}, owner=LOCAL_OWNER))  # noqa: B023 (run at once)
        remaining = {i.context_id for i in anyio.run(lambda: store.list(owner=LOCAL_OWNER))}
        if ending == "release":
            assert info.context_id not in remaining
            info = anyio.run(
                lambda: store.put_bytes(b"z" * 800, name="held", format="text", source={}, owner=LOCAL_OWNER)
            )
        else:
            assert info.context_id not in remaining  # a dead process's pin does not hold it


# PostgreSQL: two replicas (store bundles with data dirs of their own) on one database share
# the same protection, through the database's rows instead of one index file.


def _replica(tmp_path: Path, name: str, pg_url: str, grace_s: float) -> Stores:
    settings = make_settings(
        tmp_path, data_dir=tmp_path / name, database_url=pg_url, store_max_bytes=CAP, context_grace_s=grace_s
    )
    return make_stores(settings, replica=True)


@pytest.mark.anyio
@pytest.mark.parametrize(("grace_s", "kept"), [(600.0, True), (0.0, False)])
async def test_a_context_another_replica_just_stored_survives_eviction(
    tmp_path: Path, pg_url: str, grace_s: float, kept: bool
) -> None:
    async with _replica(tmp_path, "a", pg_url, grace_s) as a, _replica(tmp_path, "b", pg_url, grace_s) as b:
        theirs = await a.contexts.put_bytes(b"x" * 800, name="loaded on a", format="text", source={}, owner=LOCAL_OWNER)
        await b.contexts.put_bytes(b"y" * 800, name="mine", format="text", source={}, owner=LOCAL_OWNER)  # evicts
        ids = {i.context_id for i in await b.contexts.list(owner=LOCAL_OWNER)}
        assert (theirs.context_id in ids) is kept
        if kept:  # a run on b can still pin it and read its bytes, fetched from the database
            async with b.contexts.in_use([theirs.context_id], owner=LOCAL_OWNER) as infos:
                assert await anyio.Path(b.contexts.spec(infos[0]).path).read_bytes() == b"x" * 800


@pytest.mark.anyio
async def test_a_context_pinned_on_another_replica_survives_until_released(tmp_path: Path, pg_url: str) -> None:
    # (A pin of a replica whose heartbeat stopped protects nothing: test_store_contexts, lapsed pins.)
    async with _replica(tmp_path, "a", pg_url, 0) as a, _replica(tmp_path, "b", pg_url, 0) as b:
        info = await b.contexts.put_bytes(b"z" * 800, name="held", format="text", source={}, owner=LOCAL_OWNER)
        async with a.contexts.in_use([info.context_id], owner=LOCAL_OWNER):
            await age_context(b, info.context_id, 10 * 86400)
            await b.contexts.put_bytes(b"w" * 800, name="pressure", format="text", source={}, owner=LOCAL_OWNER)
            assert info.context_id in {i.context_id for i in await b.contexts.list(owner=LOCAL_OWNER)}
        await b.contexts.put_bytes(b"v" * 800, name="more", format="text", source={}, owner=LOCAL_OWNER)
        assert info.context_id not in {i.context_id for i in await b.contexts.list(owner=LOCAL_OWNER)}
