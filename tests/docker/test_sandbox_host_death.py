"""A sandbox whose host process is SIGKILLed stops itself: idle (its kernel's reader sees stdin
end), and while a cell holds the GIL in C code (`sum(range(...))`), which keeps that reader from
running: the host watch, a process of its own in the container, ends the kernel then."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator

import anyio
import docker.errors
import pytest

from rlm_mcp.sandbox.docker.hardening import LABEL_OWNER
from rlm_mcp.testing.sandboxes import docker_client, reap_orphans
from rlm_mcp.testing.servers import close_pipes
from tests.fixtures_sandbox import ready_manager, wait_for
from tests.paths import REPO

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

# The host opens one sandbox, says so, then (with a cell given) runs the cell; the bridge says
# when the cell asked it.
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
                print("OPEN", flush=True)
                if len(sys.argv) > 2:
                    await sb.execute(sys.argv[2], bridge)
                await anyio.sleep(3600)

    anyio.run(main)
    """
)
# Asks the host once (so the test knows the cell runs), then loops in C for hours.
GIL_CELL = 'llm_query("start")\nsum(range(10**15))'


def _containers(client, owner: str, *, all: bool = True) -> list[dict]:
    return client.api.containers(all=all, filters={"label": f"{LABEL_OWNER}={owner}"})


def _cpu_ns(client, cid: str) -> int:
    stats = client.api.stats(cid, stream=False, one_shot=True)
    return int(stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0))


@contextlib.asynccontextmanager
async def _host(*cell: str) -> AsyncIterator[tuple[subprocess.Popen[bytes], str, object]]:
    """A host process with one sandbox open (and `cell` running in it); its sandboxes are gone
    when the test leaves, whatever happened."""
    owner = "host-death-" + os.urandom(4).hex()
    proc = subprocess.Popen([sys.executable, "-c", HOST_SCRIPT, owner, *cell], stdout=subprocess.PIPE, cwd=REPO)
    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        try:
            assert proc.stdout is not None
            line = await anyio.to_thread.run_sync(proc.stdout.readline)
            assert line.strip() == b"OPEN"
            yield proc, owner, client
            await reap_orphans(mgr)
            assert _containers(client, owner) == []
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            close_pipes(proc)
            for leftover in _containers(client, owner):
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(leftover["Id"], force=True)


def _sigkill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.usefixtures("fast_channel")
async def test_host_sigkill_leaves_a_container_that_stops_itself() -> None:
    async with _host() as (proc, owner, client):
        # Counted while its host lives: once stopped, any server's start-up reaping (ours or a
        # neighbour's on this daemon) may remove it, which is the point of the design.
        assert len(_containers(client, owner, all=False)) == 1
        _sigkill(proc)
        assert await wait_for(lambda: not _containers(client, owner, all=False), timeout=30)


@pytest.mark.usefixtures("fast_channel")
async def test_a_cell_holding_the_gil_does_not_outlive_its_killed_host() -> None:
    async with _host(GIL_CELL) as (proc, owner, client):
        assert proc.stdout is not None
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        assert line.strip() == b"ASKED"
        [info] = _containers(client, owner, all=False)
        # The answer reached the cell once the container burns a CPU: the loop holds the GIL.
        start = await anyio.to_thread.run_sync(_cpu_ns, client, info["Id"])
        assert await wait_for(lambda: _cpu_ns(client, info["Id"]) - start > 300_000_000, timeout=60)
        _sigkill(proc)
        assert await wait_for(lambda: not _containers(client, owner, all=False), timeout=30)
