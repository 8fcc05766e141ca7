"""Issue 20, the store: a context whose bytes changed on disk is refused, not sent as is (item
14); the data dir, its blobs and run logs are private to the server's user (item 15)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.store import ContextStore
from rlm_mcp.testing.settings import make_settings

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("change", ["truncate", "grow", "remove"])
async def test_a_context_changed_on_disk_is_refused(tmp_path: Path, change: str) -> None:
    store = ContextStore(make_settings(tmp_path))
    info = await store.put_bytes(b"x" * 300_000, name="big", format="text", source={})
    blob = store.blob_path(info.sha256)
    if change == "truncate":
        blob.write_bytes(b"x" * 1000)
    elif change == "grow":
        blob.write_bytes(b"x" * 400_000)
    else:
        blob.unlink()
    with pytest.raises(RlmMcpError) as err:
        async with store.in_use([info.context_id]):
            pass
    if change == "remove":
        assert "Unknown context id" in str(err.value)
    else:
        assert "changed on disk" in str(err.value) and "300000" in str(err.value)
        assert "load it again" in str(err.value)
    # The refusal leaves no pin behind: the context can be deleted.
    assert await store.delete(info.context_id)


async def test_an_intact_context_is_pinned(tmp_path: Path) -> None:
    store = ContextStore(make_settings(tmp_path))
    info = await store.put_bytes(b"intact", name="ok", format="text", source={})
    async with store.in_use([info.context_id]) as infos:
        assert [i.bytes for i in infos] == [6]
    await anyio.lowlevel.checkpoint()
