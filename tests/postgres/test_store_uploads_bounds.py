"""Uploads exact and bounded (issue 14 item 8): no chunk is acknowledged while the final one is
being stored, and unfinished uploads count against the store's size cap. Over both stores
(`store_settings`: SQLite and files, then PostgreSQL)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, TooLargeError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store.ports import UploadStorePort
from tests.fixtures_both_stores import pending_upload_bytes

pytestmark = pytest.mark.anyio
BLOBS_IN_A_BUCKET = True  # the store's rules also over bytes in a bucket (store_settings' 'bucket')

StoreSettings = Callable[..., Settings]


async def _send(uploads: UploadStorePort, data: bytes, index: int, upload_id: str | None = None, **kw: Any) -> Any:
    return await uploads.put_chunk(
        data=data,
        index=index,
        upload_id=upload_id,
        final=kw.get("final", False),
        sha256=kw.get("sha256"),
        name=None,
        format=None,
        owner=LOCAL_OWNER,
    )


async def test_no_append_while_the_final_chunk_is_stored(
    store_settings: StoreSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_stores(store_settings()) as stores:
        contexts, uploads = stores.contexts, stores.uploads
        # Where the final chunk's bytes become a context: the file store hands the upload's
        # files to put_chunks; PostgreSQL stores the temp file it assembled from the chunk rows.
        storing = "put_chunks" if stores.kind == "sqlite" else "_store"
        entered, release = anyio.Event(), anyio.Event()
        real_put = getattr(contexts, storing)

        async def slow_put(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            await release.wait()
            return await real_put(*args, **kwargs)

        monkeypatch.setattr(contexts, storing, slow_put)
        first = await _send(uploads, b"one ", 0)
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def finish() -> None:
                results.append(await _send(uploads, b"two", 1, first.upload_id, final=True))

            tg.start_soon(finish)
            await entered.wait()
            with pytest.raises(BadArgumentError, match="being completed"):
                await _send(uploads, b" three", 2, first.upload_id)
            release.set()
        done = results[0]
        assert done.done and done.context.sha256 == hashlib.sha256(b"one two").hexdigest()


async def test_a_failed_final_chunk_can_be_resent(store_settings: StoreSettings) -> None:
    async with make_stores(store_settings()) as stores:
        uploads = stores.uploads
        first = await _send(uploads, b"one ", 0)
        with pytest.raises(BadArgumentError):
            await _send(uploads, b"two", 1, first.upload_id, final=True, sha256="0" * 64)
        digest = hashlib.sha256(b"one two").hexdigest()
        done = await _send(uploads, b"two", 1, first.upload_id, final=True, sha256=digest)
        assert done.done


async def test_unfinished_uploads_count_against_the_store_cap(store_settings: StoreSettings) -> None:
    settings = store_settings(store_max_bytes=1 << 20)
    async with make_stores(settings) as stores:
        uploads = stores.uploads
        half = b"x" * (1 << 19)
        a = await _send(uploads, half, 0)
        await _send(uploads, half, 1, a.upload_id)
        with pytest.raises(TooLargeError, match="uploads in progress on this server have no room"):
            await _send(uploads, b"y", 2, a.upload_id)
        with pytest.raises(TooLargeError, match="RLM_MCP_STORE_MAX_BYTES"):
            await _send(uploads, b"z", 0)  # another upload is refused too: the cap is the store's
        assert await pending_upload_bytes(stores, settings) <= settings.store.store_max_bytes
