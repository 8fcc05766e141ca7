"""Issue 20, the store: a context whose bytes changed on disk is refused, not sent as is (item
14); the data dir, its blobs and run logs are private to the server's user (item 15); a run's
log holds no descriptor until the run starts (item 11)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import CellStart
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store import ContextStore, RunStore
from rlm_mcp.testing.settings import make_settings

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("change", ["truncate", "grow", "remove"])
async def test_a_context_changed_on_disk_is_refused(tmp_path: Path, change: str) -> None:
    store = ContextStore(make_settings(tmp_path))
    info = await store.put_bytes(b"x" * 300_000, name="big", format="text", source={}, owner=LOCAL_OWNER)
    blob = store.blob_path(info.sha256)
    if change == "truncate":
        blob.write_bytes(b"x" * 1000)
    elif change == "grow":
        blob.write_bytes(b"x" * 400_000)
    else:
        blob.unlink()
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


async def test_an_intact_context_is_pinned(tmp_path: Path) -> None:
    store = ContextStore(make_settings(tmp_path))
    info = await store.put_bytes(b"intact", name="ok", format="text", source={}, owner=LOCAL_OWNER)
    async with store.in_use([info.context_id], owner=LOCAL_OWNER) as infos:
        assert [i.bytes for i in infos] == [6]
    await anyio.lowlevel.checkpoint()


def test_a_data_dir_made_beforehand_is_made_private(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    data = Path(settings.data_dir)
    data.mkdir(mode=0o755)
    data.chmod(0o755)  # as `mkdir` under the usual umask made it
    store = ContextStore(settings)

    async def write() -> str:
        info = await store.put_bytes(b"private notes", name="notes", format="text", source={}, owner=LOCAL_OWNER)
        log = await RunStore(settings).create("run_0123456789ab", {"query": "q", "status": "running"})
        await log.open()
        await log.aclose()
        return info.sha256

    sha256 = anyio.run(write)
    assert data.stat().st_mode & 0o777 == 0o700
    assert store.blob_path(sha256).stat().st_mode & 0o777 == 0o600
    for name in ("events.jsonl", "summary.json"):
        assert (data / "runs" / "run_0123456789ab" / name).stat().st_mode & 0o077 == 0, name


def _open_files_under(path: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(str(fd.readlink()))
        except OSError:  # closed since the listing
            continue
    return [t for t in targets if t.startswith(str(path))]


async def test_a_queued_run_holds_no_descriptor(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    runs = RunStore(settings)
    logs = [await runs.create(f"run_{i:012d}", {"query": "q", "status": "queued"}) for i in range(50)]
    runs_dir = Path(settings.data_dir) / "runs"
    try:
        assert _open_files_under(runs_dir) == []
        # Its record answers while it waits: a summary, no events yet.
        assert (await runs.read_summary("run_000000000007", owner=LOCAL_OWNER))["status"] == "queued"
        assert await runs.read_events("run_000000000007", owner=LOCAL_OWNER) == []
        await logs[0].open()  # the run starts
        await logs[0].append(CellStart(run_id="run_000000000000", iteration=1, block=1, depth=0))
        assert _open_files_under(runs_dir) == [str(runs_dir / "run_000000000000" / "events.jsonl")]
        assert len(await runs.read_events("run_000000000000", owner=LOCAL_OWNER)) == 1
    finally:
        for log in logs:
            await log.aclose()
    assert _open_files_under(runs_dir) == []
