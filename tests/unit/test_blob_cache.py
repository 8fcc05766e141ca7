"""This replica's local copy of context bytes (`store.pg.cache.BlobCache`): a blob is streamed
from where team mode keeps it only when its file is not here whole; a file that is here is used
as it is and its time set to now (the least recently used go first past the bound)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from rlm_mcp.store.pg.cache import BlobCache

pytestmark = pytest.mark.anyio

DATA = b"0123456789abcdef\n" * 1000
SHA = hashlib.sha256(DATA).hexdigest()


class Blobs:
    """A blob store that counts its reads."""

    where = "the test's blobs"

    def __init__(self) -> None:
        self.reads = 0

    async def read(self, sha256: str) -> AsyncIterator[bytes]:
        assert sha256 == SHA
        self.reads += 1
        for at in range(0, len(DATA), 4096):
            await anyio.lowlevel.checkpoint()
            yield DATA[at : at + 4096]


def _cache(tmp_path: Path) -> BlobCache:
    return BlobCache(tmp_path / "data" / "cache", tmp_path / "data" / "tmp")


async def test_a_missing_blob_is_fetched_once_then_used_from_the_cache(tmp_path: Path) -> None:
    cache, blobs = _cache(tmp_path), Blobs()
    path = await cache.fetch(blobs, SHA, len(DATA))  # type: ignore[arg-type]
    assert path.read_bytes() == DATA
    os.utime(path, (1_000_000, 1_000_000))  # long unused
    assert await cache.fetch(blobs, SHA, len(DATA)) == path  # type: ignore[arg-type]
    assert blobs.reads == 1
    assert path.stat().st_mtime > 1_000_000  # used now


async def test_runs_starting_together_fetch_a_blob_once(tmp_path: Path) -> None:
    cache, blobs = _cache(tmp_path), Blobs()
    paths: list[Path] = []

    async def one() -> None:
        paths.append(await cache.fetch(blobs, SHA, len(DATA)))  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert blobs.reads == 1
    assert len(set(paths)) == 1 and paths[0].read_bytes() == DATA


async def test_a_partial_or_swept_file_is_fetched_again(tmp_path: Path) -> None:
    cache, blobs = _cache(tmp_path), Blobs()
    path = await cache.fetch(blobs, SHA, len(DATA))  # type: ignore[arg-type]
    path.write_bytes(DATA[:10])  # not whole
    assert (await cache.fetch(blobs, SHA, len(DATA))).read_bytes() == DATA  # type: ignore[arg-type]
    cache.drop([SHA])  # swept
    assert (await cache.fetch(blobs, SHA, len(DATA))).read_bytes() == DATA  # type: ignore[arg-type]
    assert blobs.reads == 3
