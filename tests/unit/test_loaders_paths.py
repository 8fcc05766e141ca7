"""load_path / load_glob against real temp folders under a temp allowed root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm_mcp.errors import AccessDeniedError, BadArgumentError, TooLargeError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.loaders import load_glob, load_path
from rlm_mcp.service.loaders.patterns import matches
from rlm_mcp.store import ContextStore
from tests.fixtures_store import sections

pytestmark = pytest.mark.anyio


def _tree(root: Path, outside: Path) -> Path:
    proj = root / "proj"
    (proj / "src" / "pkg").mkdir(parents=True)
    (proj / "src" / "a.py").write_text("print('a')\n")
    (proj / "src" / "pkg" / "b.py").write_text("x = 'é'")  # no final newline
    (proj / "README.md").write_text("# readme\n")
    (proj / ".env").write_text("SECRET=1\n")
    (proj / ".git").mkdir()
    (proj / ".git" / "config").write_text("[core]\n")
    (proj / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    (proj / "latin1.txt").write_bytes(b"caf\xe9\n")
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_text("outside\n")
    os.symlink(outside / "secret.txt", proj / "escape.txt")
    os.symlink(proj / "README.md", proj / "link_readme.md")
    os.symlink(outside, proj / "linked_dir")
    return proj


def _read(loaded) -> str:
    try:
        return loaded.path.read_text()
    finally:
        loaded.cleanup()


async def test_single_file(settings, root) -> None:
    (root / "notes.txt").write_text("hello\n")
    loaded = await load_path(str(root / "notes.txt"), **sections(settings))
    assert loaded.name == "notes.txt" and loaded.source["type"] == "path" and loaded.source["bytes"] == 6
    store = ContextStore(settings)
    assert loaded.path is not None
    info = await store.put_file(
        loaded.path, name=loaded.name, format="text", source=loaded.source, consume=True, owner=LOCAL_OWNER
    )
    loaded.cleanup()
    assert info.bytes == 6 and (root / "notes.txt").exists()


async def test_folder_format_and_skips(settings, root, tmp_path) -> None:
    proj = _tree(root, tmp_path / "outside")
    loaded = await load_path(str(proj), **sections(settings))
    src = loaded.source
    text = _read(loaded)
    assert text == (
        "==> README.md <==\n# readme\n\n"
        "==> link_readme.md <==\n# readme\n\n"
        "==> src/a.py <==\nprint('a')\n\n"
        "==> src/pkg/b.py <==\nx = 'é'\n\n"
    )
    assert loaded.name == "proj" and src["type"] == "folder" and src["files"] == 4
    assert src["skipped"] == {
        "binary": 2,  # logo.png (NUL byte) and latin1.txt (invalid UTF-8)
        "hidden": 2,
        "symlink outside allowed roots": 1,
        "symlinked folder": 1,
    }
    assert sorted(src["skipped_examples"]["binary"]) == ["latin1.txt", "logo.png"]
    assert "4 files taken" in src["summary"] and "2 binary" in src["summary"]


async def test_include_exclude(settings, root, tmp_path) -> None:
    proj = _tree(root, tmp_path / "outside")
    only_py = await load_path(str(proj), **sections(settings), include=["*.py"])
    assert _read(only_py).count("==> ") == 2
    no_pkg = await load_path(str(proj), **sections(settings), include=["src/**"], exclude=["pkg"])
    assert "==> src/a.py <==" in _read(no_pkg) and no_pkg.source["skipped"]["excluded folder"] == 1
    deep = await load_path(str(proj), **sections(settings), include=["src/**/*.py"])
    assert _read(deep).count("==> src/") == 2
    assert (
        matches("**/*.py", "a.py")
        and matches("src/**/b.py", "src/pkg/b.py")
        and not matches("src/*.py", "src/pkg/b.py")
    )


async def test_max_files_and_bytes(settings_factory, root, tmp_path) -> None:
    proj = _tree(root, tmp_path / "outside")
    with pytest.raises(TooLargeError, match="RLM_MCP_MAX_FILES"):
        await load_path(str(proj), **sections(settings_factory(max_files=2)))
    with pytest.raises(TooLargeError, match="RLM_MCP_MAX_CONTEXT_BYTES"):
        await load_path(str(proj), **sections(settings_factory(max_context_bytes=40)))
    assert list((tmp_path / "data" / "tmp").iterdir()) == []  # the partial temp file is gone


async def test_access_rules(settings, root, tmp_path) -> None:
    proj = _tree(root, tmp_path / "outside")
    with pytest.raises(AccessDeniedError, match="outside the allowed roots.*RLM_MCP_ALLOWED_ROOTS"):
        await load_path(str(tmp_path / "outside" / "secret.txt"), **sections(settings))
    with pytest.raises(AccessDeniedError, match="outside the allowed roots"):
        await load_path(str(proj / "escape.txt"), **sections(settings))  # the symlink is resolved first
    with pytest.raises(AccessDeniedError, match="outside"):
        await load_path(str(tmp_path / "outside" / "missing.txt"), **sections(settings))  # no existence oracle
    with pytest.raises(AccessDeniedError, match="hidden"):
        await load_path(str(proj / ".env"), **sections(settings))
    with pytest.raises(AccessDeniedError, match="hidden"):
        await load_path(str(proj / ".git" / "config"), **sections(settings))
    with pytest.raises(BadArgumentError, match="does not exist"):
        await load_path(str(root / "missing.txt"), **sections(settings))
    with pytest.raises(BadArgumentError, match="relative"):
        await load_path("proj/README.md", **sections(settings))
    with pytest.raises(BadArgumentError, match="No text file"):
        (root / "empty").mkdir()
        await load_path(str(root / "empty"), **sections(settings))


async def test_hidden_root_opts_in(settings_factory, root) -> None:
    notes = root / ".notes"
    notes.mkdir()
    (notes / "n.txt").write_text("note\n")
    s = settings_factory(allowed_roots=[root, notes])
    assert _read(await load_path(str(notes / "n.txt"), **sections(s))) == "note\n"
    assert "==> n.txt <==" in _read(await load_path(str(notes), **sections(s)))


async def test_tilde_expansion(settings_factory, root, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(root))
    (root / "t.txt").write_text("tilde\n")
    assert _read(await load_path("~/t.txt", **sections(settings_factory()))) == "tilde\n"


async def test_glob(settings, root, tmp_path) -> None:
    proj = _tree(root, tmp_path / "outside")
    loaded = await load_glob(str(proj / "**" / "*.py"), **sections(settings))
    assert loaded.source["type"] == "glob" and loaded.source["files"] == 2
    assert _read(loaded).startswith("==> src/a.py <==\n")
    top = await load_glob(str(proj / "src" / "*.py"), **sections(settings))
    assert _read(top) == "==> a.py <==\nprint('a')\n\n"
    with pytest.raises(BadArgumentError, match="No file matches"):
        await load_glob(str(proj / "*.rs"), **sections(settings))
    with pytest.raises(AccessDeniedError):
        await load_glob(str(tmp_path / "outside" / "*.txt"), **sections(settings))
