"""Issue 20, the store: a context whose bytes changed on disk is refused, not sent as is (item
14); the data dir, its blobs and run logs are private to the server's user (item 15); a run's
log holds no descriptor until the run starts (item 11). Over both stores (`store_settings`)
where the rule is not about the file store's own files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import CellStart
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store import ContextStore, RunStore
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio
BLOBS_IN_A_BUCKET = True  # the store's rules also over bytes in a bucket (store_settings' 'bucket')

StoreSettings = Callable[..., Settings]
CHANGES = ["truncate", "grow", "remove"]


def _change(blob: Path, change: str) -> None:
    if change == "truncate":
        blob.write_bytes(b"x" * 1000)
    elif change == "grow":
        blob.write_bytes(b"x" * 400_000)
    else:
        blob.unlink()


# SQLite only: its blobs are the stored bytes themselves (PostgreSQL's are rows; below, its cache).
@pytest.mark.parametrize("change", CHANGES)
async def test_a_context_changed_on_disk_is_refused(tmp_path: Path, change: str) -> None:
    store = ContextStore(make_settings(tmp_path).store)
    info = await store.put_bytes(b"x" * 300_000, name="big", format="text", source={}, owner=LOCAL_OWNER)
    _change(store.blob_path(info.sha256), change)
    with pytest.raises(RlmMcpError) as err:
        async with store.in_use([info.context_id], owner=LOCAL_OWNER):
            pass
    if change == "remove":
        assert "Unknown context id" in str(err.value)
    else:
        assert "changed on disk" in str(err.value) and "300000" in str(err.value)
        assert "load it again" in str(err.value)
    # The refusal leaves no pin behind: the context can be deleted.
    assert await store.delete(info.context_id, owner=LOCAL_OWNER)


@pytest.mark.parametrize("change", CHANGES)
async def test_a_replicas_cached_copy_changed_on_disk_is_fetched_again(
    tmp_path: Path, pg_url: str, change: str
) -> None:
    # PostgreSQL: the bytes live in the database; a replica's cached copy that no longer has
    # their size is replaced from there before a run sees it.
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings, replica=True) as stores:
        store = stores.contexts
        info = await store.put_bytes(b"y" * 300_000, name="big", format="text", source={}, owner=LOCAL_OWNER)
        cached = store.spec(info).path
        _change(cached, change)
        async with store.in_use([info.context_id], owner=LOCAL_OWNER) as infos:
            assert store.spec(infos[0]).path.read_bytes() == b"y" * 300_000
        assert await store.delete(info.context_id, owner=LOCAL_OWNER)


async def test_an_intact_context_is_pinned(store_settings: StoreSettings) -> None:
    async with make_stores(store_settings(), replica=True) as stores:
        info = await stores.contexts.put_bytes(b"intact", name="ok", format="text", source={}, owner=LOCAL_OWNER)
        async with stores.contexts.in_use([info.context_id], owner=LOCAL_OWNER) as infos:
            assert [i.bytes for i in infos] == [6]
        await anyio.lowlevel.checkpoint()


def _premade(data: Path) -> None:
    data.mkdir(mode=0o755)
    data.chmod(0o755)  # as `mkdir` under the usual umask made it


def test_a_data_dir_made_beforehand_is_made_private(store_settings: StoreSettings) -> None:
    # SQLite: the blobs and run logs are files in the data dir. PostgreSQL: a replica's data dir
    # holds its cached copies of contexts: as private.
    settings = store_settings()
    data = Path(settings.store.data_dir)
    _premade(data)

    async def write() -> tuple[Path, str]:
        async with make_stores(settings) as stores:
            info = await stores.contexts.put_bytes(
                b"private notes", name="notes", format="text", source={}, owner=LOCAL_OWNER
            )
            log = await stores.runs.create(run_record("run_0123456789ab", {"query": "q", "status": "running"}))
            await log.open()
            await log.aclose()
            return stores.contexts.spec(info).path, stores.kind

    blob, kind = anyio.run(write)
    assert data.stat().st_mode & 0o777 == 0o700
    assert blob.is_relative_to(data) and blob.stat().st_mode & 0o777 == 0o600
    if kind == "sqlite":
        for name in ("events.jsonl", "summary.json"):
            assert (data / "runs" / "run_0123456789ab" / name).stat().st_mode & 0o077 == 0, name


def test_a_replica_that_only_fetches_keeps_its_data_dir_private(tmp_path: Path, pg_url: str) -> None:
    # PostgreSQL: a replica that never stored a context still writes one into its cache when a
    # run there uses it.
    loader = make_settings(tmp_path, data_dir=tmp_path / "loader", database_url=pg_url)
    reader = make_settings(tmp_path, data_dir=tmp_path / "reader", database_url=pg_url)
    data = Path(reader.store.data_dir)
    _premade(data)

    async def fetch() -> Path:
        async with make_stores(loader, replica=True) as a, make_stores(reader, replica=True) as b:
            info = await a.contexts.put_bytes(b"notes", name="notes", format="text", source={}, owner=LOCAL_OWNER)
            async with b.contexts.in_use([info.context_id], owner=LOCAL_OWNER) as infos:
                cached = b.contexts.spec(infos[0]).path
                assert await anyio.Path(cached).read_bytes() == b"notes"
                return cached

    cached = anyio.run(fetch)
    assert cached.is_relative_to(data)
    assert data.stat().st_mode & 0o777 == 0o700
    assert cached.stat().st_mode & 0o777 == 0o600


def _open_files_under(path: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(str(fd.readlink()))
        except OSError:  # closed since the listing
            continue
    return [t for t in targets if t.startswith(str(path))]


async def test_a_queued_runs_record_answers_before_it_starts(store_settings: StoreSettings) -> None:
    async with make_stores(store_settings()) as stores:
        runs = stores.runs
        logs = [await runs.create(run_record(f"run_{i:012d}", {"query": "q", "status": "queued"})) for i in range(3)]
        try:
            # Its record answers while it waits: a summary, no events yet.
            assert (await runs.read_summary("run_000000000001", owner=LOCAL_OWNER)).status == "queued"
            assert await runs.read_events("run_000000000001", owner=LOCAL_OWNER) == []
            await logs[0].open()  # the run starts
            await logs[0].append(CellStart(run_id="run_000000000000", iteration=1, block=1, depth=0))
            assert len(await runs.read_events("run_000000000000", owner=LOCAL_OWNER)) == 1
        finally:
            for log in logs:
                await log.aclose()


# SQLite only: file descriptors are the file store's (PostgreSQL's logs borrow pooled connections).
async def test_a_queued_run_holds_no_descriptor(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    runs = RunStore(settings.store)
    logs = [await runs.create(run_record(f"run_{i:012d}", {"query": "q", "status": "queued"})) for i in range(50)]
    runs_dir = Path(settings.store.data_dir) / "runs"
    try:
        assert _open_files_under(runs_dir) == []
        await logs[0].open()  # the run starts
        await logs[0].append(CellStart(run_id="run_000000000000", iteration=1, block=1, depth=0))
        assert _open_files_under(runs_dir) == [str(runs_dir / "run_000000000000" / "events.jsonl")]
    finally:
        for log in logs:
            await log.aclose()
    assert _open_files_under(runs_dir) == []
