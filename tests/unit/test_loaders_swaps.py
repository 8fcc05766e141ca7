"""A file replaced between the check and the read (issue 14 item 3): by a symlink to a file
outside the roots, or by a FIFO. It is skipped (folders) or refused (single files), at once,
and no worker thread is left waiting on the FIFO."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError
from rlm_mcp.service.loaders.folders import pack, walk
from rlm_mcp.service.loaders.paths import _copy_file
from rlm_mcp.service.loaders.safe_open import identity
from tests.fixtures_store import make_settings

pytestmark = pytest.mark.anyio

DEADLINE_S = 30  # generous: a blocked open would never return


def _secret(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("TOP SECRET\n")
    return secret


def _to_link(path: Path, target: Path) -> None:
    path.unlink()
    os.symlink(target, path)


def _to_fifo(path: Path, _target: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def root(settings: Settings) -> Path:
    return Path(settings.loads.allowed_roots[0])


def _data_tmp_files(settings_: Settings) -> list[Path]:
    tmp = Path(settings_.store.data_dir) / "tmp"
    return list(tmp.iterdir()) if tmp.exists() else []


@pytest.mark.parametrize("swap", [_to_link, _to_fifo], ids=["symlink-outside", "fifo"])
async def test_folder_file_swapped_after_the_walk_is_skipped(settings, root, tmp_path, swap) -> None:
    secret = _secret(tmp_path)
    proj = root / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "a.txt").write_text("kept\n")
    (proj / "sub" / "b.txt").write_text("swapped\n")
    walked = walk(proj, settings.loads, shown=str(proj))
    assert [f.rel for f in walked.files] == ["a.txt", "sub/b.txt"]
    swap(proj / "sub" / "b.txt", secret)
    with anyio.fail_after(DEADLINE_S):  # the worker thread returns: nothing waits on the FIFO
        tmp, taken, _size = await anyio.to_thread.run_sync(lambda: pack(walked, settings.store, shown=str(proj)))
    try:
        text = tmp.read_text()
    finally:
        tmp.unlink()
    assert taken == 1 and "TOP SECRET" not in text and "kept" in text
    reason = "changed during load" if swap is _to_link else "not a regular file"
    assert walked.skipped[reason] == 1


async def test_folder_swapped_for_a_link_after_the_walk_is_not_entered(settings, root, tmp_path) -> None:
    secret = _secret(tmp_path)
    proj = root / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "sub" / "secret.txt").write_text("inside\n")
    walked = walk(proj, settings.loads, shown=str(proj))
    (proj / "sub" / "secret.txt").unlink()
    (proj / "sub").rmdir()
    os.symlink(secret.parent, proj / "sub")  # same relative path now leads outside the roots
    tmp, taken, _ = pack(walked, settings.store, shown=str(proj))
    try:
        assert taken == 0 and "TOP SECRET" not in tmp.read_text()
    finally:
        tmp.unlink()
    assert walked.skipped["changed during load"] == 1


@pytest.mark.parametrize("swap", [_to_link, _to_fifo], ids=["symlink-outside", "fifo"])
async def test_single_file_swapped_after_the_check_is_refused(settings, root, tmp_path, swap) -> None:
    secret = _secret(tmp_path)
    path = root / "notes.txt"
    path.write_text("notes\n")
    checked = identity(path.stat())
    swap(path, secret)
    with anyio.fail_after(DEADLINE_S), pytest.raises(BadArgumentError, match="replaced|not a regular file"):
        await anyio.to_thread.run_sync(lambda: _copy_file(path, checked, settings))
    assert _data_tmp_files(settings) == []  # no temp copy left behind


async def test_single_file_replaced_by_another_file_is_refused(settings, root) -> None:
    path = root / "notes.txt"
    path.write_text("notes\n")
    checked = identity(path.stat())
    other = root / "other.txt"
    other.write_text("other\n")
    os.replace(other, path)  # a regular file, but not the one checked
    with pytest.raises(BadArgumentError, match="replaced"):
        _copy_file(path, checked, settings)
