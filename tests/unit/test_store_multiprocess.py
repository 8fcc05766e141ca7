"""Two server processes on one data dir: concurrent puts, pins, deletes and evictions."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
from pathlib import Path

import anyio
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import UnknownIdError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store import ContextStore, UploadStore


def _worker(data_dir: str, worker: int, rounds: int) -> None:
    async def main() -> None:
        settings = Settings(
            data_dir=Path(data_dir), allowed_roots=[Path(data_dir)], store_max_bytes=4000, context_grace_s=0
        )
        store = ContextStore(settings.store)
        uploads = UploadStore(settings.store, store)
        for i in range(rounds):
            # Half the contents are shared by both workers (same ids), half are private.
            shared = await store.put_bytes(
                f"shared {i % 7}".encode() * 20, name=f"s{i}", format="text", source={}, owner=LOCAL_OWNER
            )
            own = await store.put_bytes(
                f"worker {worker} item {i}".encode() * 20, name="own", format="text", source={}, owner=LOCAL_OWNER
            )
            try:
                async with store.in_use([own.context_id], owner=LOCAL_OWNER) as infos:
                    assert infos[0].context_id == own.context_id
                    assert store.spec(infos[0]).path.exists()
            except UnknownIdError:
                # With no grace period the other process's eviction may take it before this pin
                # (SQLite hands its write lock to whichever process asks first, not in turn): the
                # pin is then refused whole, and the check below finds no row without its blob.
                pass
            if i % 3 == 0:
                try:
                    await store.delete(shared.context_id, owner=LOCAL_OWNER)
                except Exception as exc:  # in use by the other worker is the one allowed refusal
                    assert "in use" in str(exc)
            state = await uploads.put_chunk(
                data=f"up {worker} {i}".encode(),
                index=0,
                upload_id=None,
                final=True,
                sha256=None,
                name=None,
                format=None,
                owner=LOCAL_OWNER,
            )
            assert state.done and state.context is not None
            await store.list(owner=LOCAL_OWNER)

    anyio.run(main)


def test_two_processes_share_a_data_dir(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / "data"), w, 40)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]

    async def check() -> None:
        store = ContextStore(Settings(data_dir=tmp_path / "data", allowed_roots=[tmp_path]).store)
        infos = await store.list(owner=LOCAL_OWNER)
        assert infos
        for info in infos:  # every indexed context has its blob, with the right size
            assert store.spec(info).path.stat().st_size == info.bytes
        assert sum(i.bytes for i in infos) <= 4000 + max(i.bytes for i in infos)

    anyio.run(check)


@pytest.mark.anyio
async def test_two_instances_many_tasks(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", allowed_roots=[tmp_path])
    stores = [ContextStore(settings.store), ContextStore(settings.store)]
    ids: list[str] = []

    async def put(n: int) -> None:
        info = await stores[n % 2].put_bytes(
            f"item {n % 10}".encode(), name=str(n), format="text", source={}, owner=LOCAL_OWNER
        )
        ids.append(info.context_id)

    async with anyio.create_task_group() as tg:
        for n in range(60):
            tg.start_soon(put, n)
    assert len(set(ids)) == 10
    assert len(await stores[0].list(owner=LOCAL_OWNER)) == 10


def _open_fresh(data_dir: str, barrier: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    async def main() -> None:
        store = ContextStore(Settings(data_dir=Path(data_dir), allowed_roots=[Path(data_dir)]).store)
        await store.put_bytes(b"first write", name="x", format="text", source={}, owner=LOCAL_OWNER)

    barrier.wait()
    try:
        anyio.run(main)
        results.put("ok")
    except Exception as exc:  # reported to the test, which shows it
        results.put(repr(exc))


def test_servers_starting_together_on_a_fresh_data_dir(tmp_path: Path) -> None:
    # Fresh index files switched to WAL by several processes at the same instant used to
    # fail one of them with "database is locked" (about one start in thirty).
    ctx = multiprocessing.get_context("fork")
    for trial in range(12):
        data_dir = str(tmp_path / f"data{trial}")
        barrier, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_open_fresh, args=(data_dir, barrier, results)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = [results.get(timeout=5) for _ in procs]
        assert outcomes == ["ok"] * 6, (trial, outcomes)
