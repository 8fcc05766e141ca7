"""The real `vllm-router` (PyPI, a Rust binary in a wheel) in front of scripted backends.

It is installed once, pinned, into a virtual environment of its own under the user's cache
directory (not into the test environment: it brings FastAPI, uvicorn and more that nothing else
needs, and its own pins must not move ours). Installing needs the package index, as
`uv sync --group test` does; a failed install fails the tests that need it, with the command.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_uv import cached_venv

VLLM_ROUTER = "vllm-router==0.1.17"


def router_binary() -> Path:
    """The `vllm-router` executable, installed on first use."""
    return cached_venv(VLLM_ROUTER) / "bin" / "vllm-router"


@asynccontextmanager
async def vllm_router(
    workers: Sequence[str], *extra: str, log: Path, policy: str = "consistent_hash", env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """Run `vllm-router --policy <policy>` over `workers` (root URLs); yield its /v1 URL."""
    port = free_port()
    argv = [
        str(router_binary()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--worker-urls",
        *workers,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),  # its default port is shared by every router on the machine
        "--log-level",
        "info",
        *extra,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1", **(env or {})}
        )
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"vllm-router exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(ready, within_s=60, what="vllm-router answering /health")
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
