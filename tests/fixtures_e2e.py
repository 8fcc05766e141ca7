"""Helpers for end-to-end tests: the real `rlm-mcp` console script over stdio, a scripted LM
on loopback, and a look at Docker to prove nothing is left behind."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import docker
from mcp import Client, StdioServerParameters

SERVER_SCRIPT = Path(sys.executable).parent / "rlm-mcp"


def new_instance_id() -> str:
    """A fresh owner id for one test's server, so the test sees only its own containers."""
    return f"test-{secrets.token_hex(6)}"


def _owned_containers(owner: str) -> list[dict[str, Any]]:
    """Docker's listing (running or not) of the containers of the server started with
    RLM_MCP_INSTANCE_ID=owner. Never count by the bare label: other rlm-mcp servers may share
    this Docker daemon."""
    client = docker.from_env()
    try:
        # The low-level listing: `containers.list` inspects each container afterwards, which
        # raises NotFound when a server removes one in between (pool churn).
        found: list[dict[str, Any]] = client.api.containers(all=True, filters={"label": f"rlm-mcp.owner={owner}"})
        return found
    finally:
        client.close()


def sandbox_container_ids(owner: str) -> set[str]:
    """The ids of the containers of the server started with RLM_MCP_INSTANCE_ID=owner."""
    return {c["Id"] for c in _owned_containers(owner)}


def sandbox_states(owner: str) -> list[str]:
    """'name: state (status)' of each container of the server started with
    RLM_MCP_INSTANCE_ID=owner: what a failure says when some are left (a removal still in
    progress, a pool container, a run's that was never retired)."""
    return sorted(
        f"{'/'.join(c.get('Names') or [c['Id'][:12]])}: {c.get('State')} ({c.get('Status')})"
        for c in _owned_containers(owner)
    )


def assert_no_sandboxes_left(owner: str, within_s: float = 60.0) -> None:
    """The server started with RLM_MCP_INSTANCE_ID=owner has removed all its sandboxes, or does so
    within `within_s` (removal of a cancelled run's sandbox may still be settling when a client ends)."""
    deadline = time.monotonic() + within_s
    while sandbox_container_ids(owner):
        assert time.monotonic() < deadline, f"sandboxes left behind by {owner}: {sandbox_states(owner)}"
        time.sleep(0.2)


def coverage_env() -> dict[str, str]:
    """The variables coverage's subprocess patch needs, so a measured test run also measures the
    servers and CLIs it starts with an environment of its own (empty when not measuring)."""
    return {k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")}


def docker_host_env() -> dict[str, str]:
    """DOCKER_HOST as this process has it (empty when unset): the Docker engine a test was given
    (Podman's socket in CI's Podman leg), and in the fast tier a socket that does not exist
    (tests/conftest.py), so a process the test starts never falls back to the default socket."""
    return {"DOCKER_HOST": os.environ["DOCKER_HOST"]} if "DOCKER_HOST" in os.environ else {}


def cli_env(root: Path, **extra: str) -> dict[str, str]:
    """The environment of a one-off `rlm-mcp` command in a test: its own data dir under `root`,
    `root` as the allowed root, no warm pool, its own instance id, no reference download."""
    return {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", ""),
        "RLM_MCP_DATA_DIR": str(root / "data"),
        "RLM_MCP_ALLOWED_ROOTS": str(root),
        "RLM_MCP_POOL_SIZE": "0",
        "RLM_MCP_LOG_LEVEL": "WARNING",
        "RLM_MCP_INSTANCE_ID": new_instance_id(),
        "RLM_MCP_REFERENCE_FETCH": "false",
        **coverage_env(),
        **docker_host_env(),
        **extra,
    }


def cli(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """One `rlm-mcp ARGS` command with `cli_env(root, **env)`: its exit status and output."""
    full_env = cli_env(root, **env)
    return subprocess.run([str(SERVER_SCRIPT), *args], env=full_env, capture_output=True, text=True, timeout=120)


def minimal_env(base_url: str, data_dir: Path, roots: list[Path], **extra: str) -> dict[str, str]:
    """What agent frameworks' stdio clients pass: HOME and PATH plus what the server needs."""
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "RLM_MCP_BASE_URL": base_url,
        "RLM_MCP_DATA_DIR": str(data_dir),
        "RLM_MCP_ALLOWED_ROOTS": os.pathsep.join(str(r) for r in roots),
        "RLM_MCP_POOL_SIZE": "1",
        "RLM_MCP_LOG_LEVEL": "WARNING",
        "RLM_MCP_INSTANCE_ID": new_instance_id(),
        **coverage_env(),
        # No download of the reference wheel from a test server; the fidelity tests seed it.
        "RLM_MCP_REFERENCE_FETCH": "false",
        **docker_host_env(),
    }
    env.update(extra)
    return env


@asynccontextmanager
async def stdio_client(env: dict[str, str], **client_kwargs: Any) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=str(SERVER_SCRIPT), args=[], env=env)
    async with Client(params, **client_kwargs) as client:
        yield client


def write_haystack(path: Path, *, lines: int, needle_line: int, needle: str) -> int:
    """A multi-megabyte text with one hidden fact; returns its size in bytes."""
    with path.open("w", encoding="utf-8") as out:
        for i in range(lines):
            if i == needle_line:
                out.write(f"Note {i:07d}: the secret code is {needle}. Remember it.\n")
            else:
                out.write(f"filler line {i:07d}: nothing to see here, keep scrolling along.\n")
    return path.stat().st_size
