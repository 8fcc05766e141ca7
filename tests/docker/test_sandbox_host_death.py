"""A sandbox whose host process is SIGKILLed while a cell holds the GIL in C code stops itself.

The kernel's reader thread ends the kernel when stdin closes (the host is gone), but a cell looping
in C (`sum(range(...))`) never lets that thread run. The host watch, a process of its own in the
container, ends the kernel then.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import anyio
import docker.errors
import pytest

from rlm_mcp.sandbox.docker.hardening import LABEL_OWNER
from rlm_mcp.testing.sandboxes import docker_client, reap_orphans
from rlm_mcp.testing.servers import close_pipes
from tests.fixtures_sandbox import ready_manager, wait_for
from tests.paths import REPO

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

# The cell asks the host once (so the host can say the cell runs), then loops in C for hours.
HOST_SCRIPT = textwrap.dedent(
    """
    import anyio, sys
    from tests.fixtures_sandbox import sandbox_settings
    from rlm_mcp.sandbox.manager import SandboxManager

    async def bridge(request):
        print("ASKED", flush=True)
        return ["go"] * len(request.prompts)

    async def main():
        async with SandboxManager(sandbox_settings(pool_size=0).sandbox, owner_id=sys.argv[1]) as mgr:
            await mgr.ensure_ready()
            async with mgr.open([]) as sb:
                await sb.execute('llm_query("start")\\nsum(range(10**15))', bridge)

    anyio.run(main)
    """
)


def _containers(client, owner: str, *, all: bool = True) -> list[dict]:
    return client.api.containers(all=all, filters={"label": f"{LABEL_OWNER}={owner}"})


def _cpu_ns(client, cid: str) -> int:
    stats = client.api.stats(cid, stream=False, one_shot=True)
    return int(stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0))


@pytest.mark.usefixtures("fast_channel")
async def test_a_cell_holding_the_gil_does_not_outlive_its_killed_host() -> None:
    owner = "gil-held-" + os.urandom(4).hex()
    proc = subprocess.Popen([sys.executable, "-c", HOST_SCRIPT, owner], stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None
    stdout = proc.stdout
    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        try:
            try:
                line = await anyio.to_thread.run_sync(stdout.readline)
                assert line.strip() == b"ASKED"
                [info] = _containers(client, owner, all=False)
                cid = info["Id"]
                # The answer reached the cell once the container burns a CPU: the loop holds the GIL.
                start = await anyio.to_thread.run_sync(_cpu_ns, client, cid)
                assert await wait_for(lambda: _cpu_ns(client, cid) - start > 300_000_000, timeout=60)
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                close_pipes(proc)
            assert await wait_for(lambda: not _containers(client, owner, all=False), timeout=30)
            await reap_orphans(mgr)
            assert _containers(client, owner) == []
        finally:
            for leftover in _containers(client, owner):
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(leftover["Id"], force=True)
