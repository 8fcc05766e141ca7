"""The JavaScript tools the tests run, installed once from `tests/js/package.json` (exact
versions, `package-lock.json`) into a cache folder keyed by the lock file's hash, so that a second
run, or CI with a warm cache, installs nothing. Node and npm are prerequisites (README)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.parallel import shared_lock

JS_DIR = Path(__file__).resolve().parent / "js"


def _cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "rlm-mcp-tests" / "js"


def js_tools() -> Path:
    """The folder holding `node_modules/.bin` with the pinned tools (installed when missing)."""
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), (
        "Node.js and npm are prerequisites of the test suite (docs/getting-started.md, Install)."
    )
    return npm_installed(JS_DIR, [npm])


def npm_installed(source: Path, npm: Sequence[str], env: Mapping[str, str] | None = None) -> Path:
    """`npm ci` of `source`'s package.json and package-lock.json (`npm`: the command that runs
    npm) in a cache folder keyed by their hash; the folder."""
    lock = (source / "package-lock.json").read_bytes()
    target = _cache_root() / hashlib.sha256(lock + (source / "package.json").read_bytes()).hexdigest()[:16]
    if (target / ".installed").exists():
        return target
    with shared_lock(target):  # one `npm ci` at a time, not one per worker
        if not (target / ".installed").exists():
            _install(source, npm, env, target)
    return target


def _install(source: Path, npm: Sequence[str], env: Mapping[str, str] | None, target: Path) -> None:
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(source / name, staging / name)
    done = subprocess.run(
        [*npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=staging,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DISABLE_AUTOUPDATER": "1", **(env or {})},
    )
    assert done.returncode == 0, f"npm ci in {staging} failed:\n{done.stderr[-3000:]}"
    (staging / ".installed").touch()
    try:
        staging.rename(target)
    except OSError:  # another test process installed it first
        shutil.rmtree(staging, ignore_errors=True)


def js_bin(name: str) -> str:
    return str(js_tools() / "node_modules" / ".bin" / name)
