"""Fixtures of the sandbox tests: real Docker, the real image, small limits."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.ports import ContextSpec, LMRequest
from rlm_mcp.ports.kernel import KernelChannel
from rlm_mcp.sandbox.docker.container import KernelContainer
from rlm_mcp.sandbox.docker.docker_api import connect_sync, image_present_sync
from rlm_mcp.sandbox.docker.engine import EngineInfo
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.testing.settings import make_settings

# What Docker 20.10 and Podman 4.3 answer on /version and /info (the fields rlm-mcp reads), as
# sent on this project's CI machine kind (tests/unit/test_engine_detection.py, test_engine_start_check.py).
DOCKER_VERSION = {"Version": "20.10.24+dfsg1", "Components": [{"Name": "Engine", "Version": "20.10.24+dfsg1"}]}
PODMAN_VERSION = {
    "Platform": {"Name": "linux/amd64/debian-12"},
    "Version": "4.3.1",
    "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}, {"Name": "Conmon"}],
}
LIMITS = {"MemoryLimit": True, "PidsLimit": True, "CpuCfsQuota": True}
DOCKER_INFO = {
    **LIMITS,
    "CgroupVersion": "1",
    "Runtimes": {"runc": {}, "runsc": {"path": "/usr/bin/runsc"}},
    "DefaultRuntime": "runc",
    "SecurityOptions": ["name=seccomp,profile=default"],
}
PODMAN_INFO = {**LIMITS, "CgroupVersion": "1", "Rootless": False, "Runtimes": {"crun": {}, "runc": {}}}

TEST_RUNTIME_VAR = "RLM_TEST_SANDBOX_RUNTIME"  # the sandbox tests' runtime (not an RLM_MCP_* setting)


def sandbox_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        cell_timeout_s=3,
        sandbox_memory="256m",
        sandbox_tmpfs="32m",
        sandbox_pids=64,
        pool_size=1,
        max_sandboxes=4,
        model="root-model",
        sub_model="sub-model",
        # .ci/run runs the sandbox tests again under gVisor with this (the suite clears RLM_MCP_*).
        sandbox_runtime=os.environ.get(TEST_RUNTIME_VAR) or None,
    )
    values.update(overrides)
    return make_settings(**values)


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The sandbox image must exist (CI builds it first); fail loudly with the fix if not."""
    settings = Settings()
    client = connect_sync()
    try:
        if not image_present_sync(client, settings.sandbox.sandbox_image):
            pytest.fail(
                f"The sandbox image {settings.sandbox.sandbox_image} is missing. Build it first: "
                "`rlm-mcp image build --offline` (or python -c 'from rlm_mcp.config import Settings; "
                "from rlm_mcp.sandbox.docker.image import build_image; build_image(Settings(), offline=True)')"
            )
    finally:
        client.close()
    return settings.sandbox.sandbox_image


async def wait_for(predicate: Callable[[], Any], timeout: float = 60.0) -> bool:
    """Poll `predicate` (a blocking call, run in a worker thread) until true or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await anyio.to_thread.run_sync(predicate):
            return True
        await anyio.sleep(0.1)
    return False


FAST_CHANNEL_VAR = "RLM_MCP_SANDBOX_FAST_CHANNEL"


# Under another runtime (gVisor's runsc takes no host unix socket) `auto` is the attach stream:
# the same run as `off`, so it is not run twice.
FAST_CHANNEL_MODES = ["off"] if os.environ.get(TEST_RUNTIME_VAR) else ["auto", "off"]


@pytest.fixture(params=FAST_CHANNEL_MODES)
def fast_channel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs twice: frames over the fast channel's unix socket (auto, on a local Docker
    with runc) and over the attach stream alone (off). Child processes inherit the setting."""
    monkeypatch.setenv(FAST_CHANNEL_VAR, request.param)
    return str(request.param)


@contextlib.asynccontextmanager
async def ready_manager(**overrides: Any) -> AsyncIterator[SandboxManager]:
    """A started manager. Not a fixture: its task group must be entered and left in one task."""
    async with SandboxManager(sandbox_settings(**overrides).sandbox) as mgr:
        await mgr.ensure_ready()
        yield mgr


def text_context(tmp_path: Path, text: str, name: str = "ctx.txt") -> ContextSpec:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return ContextSpec(path=path, format="text", kind="str", chars=len(text), bytes=path.stat().st_size, name=name)


def json_context(tmp_path: Path, value: Any, name: str = "ctx.json") -> ContextSpec:
    path = tmp_path / name
    data = json.dumps(value)
    path.write_text(data, encoding="utf-8")
    kind: Literal["list", "dict"] = "list" if isinstance(value, list) else "dict"
    return ContextSpec(path=path, format="json", kind=kind, chars=len(data), bytes=path.stat().st_size, name=name)


class FakeBridge:
    """Answers every prompt with `echo:<prompt>` and records the requests."""

    def __init__(self) -> None:
        self.requests: list[LMRequest] = []

    async def __call__(self, request: LMRequest) -> list[str]:
        self.requests.append(request)
        return [f"echo:{p}" for p in request.prompts]

    @property
    def prompts(self) -> int:
        return sum(len(r.prompts) for r in self.requests)


async def no_bridge(request: LMRequest) -> list[str]:
    return ["Error: no LM in this test"] * len(request.prompts)


def engine_of(mgr: SandboxManager) -> EngineInfo | None:
    """What the manager's Docker engine is and can do (Podman needs it for raw containers)."""
    return getattr(mgr.backend, "engine", None)


def container_id(channel: KernelChannel | None) -> str:
    """The Docker id of a sandbox's kernel: the Docker backend's channel is a container."""
    assert isinstance(channel, KernelContainer) and channel.id is not None, channel
    return channel.id
