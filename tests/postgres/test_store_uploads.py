"""UploadStore: chunk protocol, idempotent resend, sha checks, restarts, caps, expiry.
Every test runs against both stores (`store_settings`: SQLite and files, then PostgreSQL)."""

from __future__ import annotations

import hashlib

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.errors import BadArgumentError, NotFoundError, TooLargeError
from rlm_mcp.owners import LOCAL_OWNER
from tests.fixtures_both_stores import age_uploads, stored_bytes, upload_chunks_kept

pytestmark = pytest.mark.anyio
BLOBS_IN_A_BUCKET = True  # the store's rules also over bytes in a bucket (store_settings' 'bucket')


async def _send(uploads, data, index, upload_id=None, final=False, sha256=None, name=None, format=None):
    return await uploads.put_chunk(
        data=data,
        index=index,
        upload_id=upload_id,
        final=final,
        sha256=sha256,
        name=name,
        format=format,
        owner=LOCAL_OWNER,
    )


async def test_upload_in_chunks(store_settings) -> None:
    settings = store_settings()
    async with make_stores(settings) as stores:
        await _upload_in_chunks(stores, settings)


async def _upload_in_chunks(stores, settings) -> None:
    uploads = stores.uploads
    text = "é" * 10 + "tail"
    raw = text.encode()
    parts = [raw[:5], raw[5:13], raw[13:]]  # cuts inside multi-byte characters
    first = await _send(uploads, parts[0], 0, name="doc")
    assert first.upload_id.startswith("upl_") and first.next_index == 1 and not first.done
    assert first.bytes_received == 5 and first.context is None
    second = await _send(uploads, parts[1], 1, first.upload_id)
    assert second.next_index == 2
    done = await _send(uploads, parts[2], 2, first.upload_id, final=True, sha256=hashlib.sha256(raw).hexdigest())
    assert done.done and done.context is not None
    assert done.context.name == "doc" and done.context.chars == len(text) and done.context.format == "text"
    assert done.context.source["type"] == "upload"
    assert await stored_bytes(stores, done.context.sha256) == raw
    assert not await upload_chunks_kept(stores, settings, first.upload_id)  # chunks deleted
    # Resending the final chunk after completion returns the same handle.
    again = await _send(uploads, parts[2], 2, first.upload_id, final=True)
    assert again.done and again.context.context_id == done.context.context_id


async def test_single_chunk_json_upload(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        await _single_chunk_json(stores.uploads)


async def _single_chunk_json(uploads) -> None:
    state = await _send(uploads, b'{"k": [1]}', 0, final=True, format="json")
    assert state.done and state.context.kind == "dict" and state.context.context_id.endswith("_json")


async def test_idempotent_resend_and_gaps(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        await _idempotent_resend_and_gaps(stores.uploads)


async def _idempotent_resend_and_gaps(uploads) -> None:
    s = await _send(uploads, b"aaa", 0)
    again = await _send(uploads, b"aaa", 0, s.upload_id)
    assert again.next_index == 1 and again.bytes_received == 3
    with pytest.raises(BadArgumentError, match="different bytes.*index 1"):
        await _send(uploads, b"bbb", 0, s.upload_id)
    with pytest.raises(BadArgumentError, match="out of order.*expects index 1"):
        await _send(uploads, b"ccc", 2, s.upload_id)
    with pytest.raises(BadArgumentError, match="without an upload_id"):
        await _send(uploads, b"ccc", 1)
    s2 = await _send(uploads, b"bbb", 1, s.upload_id)
    assert s2.next_index == 2 and s2.bytes_received == 6


async def test_sha_mismatch_then_resend(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        await _sha_mismatch_then_resend(stores.contexts, stores.uploads)


async def _sha_mismatch_then_resend(contexts, uploads) -> None:
    s = await _send(uploads, b"hello ", 0)
    with pytest.raises(BadArgumentError, match="sha256"):
        await _send(uploads, b"world", 1, s.upload_id, final=True, sha256="0" * 64)
    assert await contexts.list(owner=LOCAL_OWNER) == []
    good = hashlib.sha256(b"hello world").hexdigest()
    done = await _send(uploads, b"world", 1, s.upload_id, final=True, sha256=good)
    assert done.done and done.context.sha256 == good


async def test_resume_after_restart(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        s = await _send(stores.uploads, b"part one, ", 0, name="resumed")
    # A new server process: fresh stores on the same data dir (or database).
    async with make_stores(store_settings()) as restarted:
        done = await _send(restarted.uploads, b"part two", 1, s.upload_id, final=True)
    assert done.context.name == "resumed"
    assert done.context.bytes == len(b"part one, part two")


async def test_caps_and_unknown_ids(store_settings) -> None:
    async with make_stores(store_settings(max_context_bytes=(1 << 20) + 10)) as stores:
        await _caps_and_unknown_ids(stores.uploads)


async def _caps_and_unknown_ids(uploads) -> None:
    with pytest.raises(TooLargeError, match="1 MiB"):
        await _send(uploads, b"x" * ((1 << 20) + 1), 0)
    s = await _send(uploads, b"x" * (1 << 20), 0)
    with pytest.raises(TooLargeError, match="RLM_MCP_MAX_CONTEXT_BYTES"):
        await _send(uploads, b"x" * 11, 1, s.upload_id)
    with pytest.raises(NotFoundError, match="Unknown upload id"):
        await _send(uploads, b"x", 1, "upl_" + "0" * 24)
    with pytest.raises(NotFoundError):
        await _send(uploads, b"x", 1, "../../etc")
    with pytest.raises(BadArgumentError, match="64 hexadecimal"):
        await _send(uploads, b"x", 0, final=True, sha256="abc")


async def test_invalid_text_upload_is_kept(store_settings) -> None:
    async with make_stores(store_settings()) as stores:
        await _invalid_text_upload_is_kept(stores.uploads)


async def _invalid_text_upload_is_kept(uploads) -> None:
    s = await _send(uploads, b"ok ", 0)
    with pytest.raises(BadArgumentError, match="not UTF-8"):
        await _send(uploads, b"\xff", 1, s.upload_id, final=True)
    state = await _send(uploads, b"\xff", 1, s.upload_id)  # the chunk is stored; the upload lives
    assert state.next_index == 2 and not state.done


async def test_stale_upload_expires(store_settings) -> None:
    settings = store_settings()
    async with make_stores(settings) as stores:
        s = await _send(stores.uploads, b"old", 0)
        await age_uploads(stores, 2 * 86400)
        await _send(stores.uploads, b"new", 0)  # any chunk runs the expiry
        assert not await upload_chunks_kept(stores, settings, s.upload_id)
        with pytest.raises(NotFoundError, match="expire"):
            await _send(stores.uploads, b"more", 1, s.upload_id)
