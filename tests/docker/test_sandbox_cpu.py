"""Issue 14 item 9: the sandboxes in use share at most RLM_MCP_SANDBOX_TOTAL_CPUS (real Docker).

Where the engine cannot update quotas in place (Debian's runsc, Podman: issue 24), each sandbox
keeps its fixed quota instead, and the manager says so: these tests check that branch there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.sandbox.session import KernelSandbox
from rlm_mcp.testing.sandboxes import docker_client
from tests.fixtures_sandbox import container_id, ready_manager, text_context

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]


async def _cpus(client: Any, sb: KernelSandbox) -> float:
    info = await anyio.to_thread.run_sync(client.api.inspect_container, container_id(sb.container))
    host = info["HostConfig"]
    return float(host["CpuQuota"]) / float(host["CpuPeriod"])


async def _settled(client: Any, sandboxes: tuple[KernelSandbox, ...], expected: list[float]) -> list[float]:
    """The sandboxes' quotas once they equal `expected` (they follow membership changes in a
    background pass); what they are after a generous deadline otherwise."""
    shares: list[float] = []
    with anyio.move_on_after(30):
        while (shares := [round(await _cpus(client, sb), 3) for sb in sandboxes]) != expected:
            await anyio.sleep(0.05)
    return shares


async def test_sandboxes_in_use_split_the_total_and_take_it_back(tmp_path: Path) -> None:
    async with ready_manager(pool_size=1, sandbox_cpus=1.0, sandbox_total_cpus=1.5) as mgr:
        client = await docker_client(mgr)
        ctx = [text_context(tmp_path, "ctx")]
        async with mgr.open(ctx) as first:
            assert await _cpus(client, first) == 1.0  # alone: its full quota (under the total)
            if mgr.cpu_fallback is not None:  # no in-place updates: fixed quotas, announced
                async with mgr.open(ctx) as second, mgr.open(ctx) as third:
                    assert [await _cpus(client, sb) for sb in (first, second, third)] == [1.0, 1.0, 1.0]
                assert "fixed quota of 1 CPUs" in mgr.cpu_fallback[0]
                assert "RLM_MCP_SANDBOX_CPUS=0.38" in mgr.cpu_fallback[1]  # 1.5 CPUs / 4 sandboxes
                return
            async with mgr.open(ctx) as second, mgr.open(ctx) as third:
                # 1.5 CPUs split three ways
                assert await _settled(client, (first, second, third), [0.5, 0.5, 0.5]) == [0.5, 0.5, 0.5]
            # the others ended: its quota grows back
            assert await _settled(client, (first,), [1.0]) == [1.0]


async def test_the_default_total_is_the_docker_hosts_cpu_count(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0, sandbox_cpus=1.0) as mgr:
        client = await docker_client(mgr)
        ncpu = (await anyio.to_thread.run_sync(client.info))["NCPU"]
        ctx = [text_context(tmp_path, "ctx")]
        async with mgr.open(ctx) as a, mgr.open(ctx) as b, mgr.open(ctx) as c, mgr.open(ctx) as d:
            if mgr.cpu_fallback is not None:  # no in-place updates: each keeps 1 CPU, announced
                assert [await _cpus(client, sb) for sb in (a, b, c, d)] == [1.0] * 4
                assert f"the host has {ncpu:g}" in mgr.cpu_fallback[0]
                return
            share = min(1.0, max(ncpu, 1) / 4)
            total = sum(await _settled(client, (a, b, c, d), [share] * 4))
            assert total <= max(ncpu, 1) + 1e-6
            assert total == pytest.approx(min(4.0, ncpu), abs=0.01)
