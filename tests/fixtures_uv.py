"""uv for the tests that run the README's commands as written, and for the tools and clients the
tests run in virtual environments of their own (their pins must not move ours)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import platformdirs

from tests.parallel import shared_lock

REPO = Path(__file__).resolve().parents[1]
# Forwarded to commands run as a user would run them (certificates, caches, index settings).
PASS_THROUGH = (
    "DOCKER_HOST",
    "UV_CACHE_DIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "NODE_EXTRA_CA_CERTS",
    "npm_config_cache",
)


def uv_path() -> str:
    """uv from PATH, else the one the test extra installs beside this interpreter."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    assert found, "uv is a prerequisite (docs/getting-started.md, Install): pip install uv"
    return found


def user_env(project_env: Path, **extra: str) -> dict[str, str]:
    """A user's shell: HOME, PATH with uv on it, and uv's project venv in `project_env` so that
    the checkout's own .venv (maybe the one running these tests) is never re-synced."""
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": f"{Path(uv_path()).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "UV_PROJECT_ENVIRONMENT": str(project_env),
    }
    env.update({name: os.environ[name] for name in PASS_THROUGH if name in os.environ})
    env.update(extra)
    return env


def uv_cache_dir() -> str:
    """uv's cache as this user has it: a test that moves HOME keeps it (no second download)."""
    done = subprocess.run([uv_path(), "cache", "dir"], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def make_venv(home: Path, *requirements: str, python: str = sys.executable, timeout_s: float = 600) -> Path:
    """A uv virtual environment at `home` (`python`: the interpreter, or a version uv finds)
    holding `requirements`; its Python. A failed step raises with its command and what it said."""
    for argv in (
        [uv_path(), "venv", "-q", "--python", python, str(home)],
        [uv_path(), "pip", "install", "-q", "--python", str(home / "bin" / "python"), *requirements],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"installing {' '.join(requirements)} failed: {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return home / "bin" / "python"


def cached_venv(requirement: str, *, timeout_s: float = 600) -> Path:
    """The folder of a tool pinned by `requirement` (NAME==VERSION) in a virtual environment of its
    own under the user's cache directory (~/.cache/rlm-mcp-tests/NAME-VERSION), installed on first
    use; a marker says the install finished, so a half-finished one is started again."""
    home = Path(platformdirs.user_cache_dir("rlm-mcp-tests")) / requirement.replace("==", "-")
    done = home / ".installed"
    if done.exists():
        return home
    with shared_lock(home, timeout_s=timeout_s + 60):  # another worker may be installing it
        if not done.exists():
            shutil.rmtree(home, ignore_errors=True)
            make_venv(home, requirement, timeout_s=timeout_s)
            done.write_text(requirement + "\n", encoding="utf-8")
    return home
