"""Issue 14 item 12: the Docker connection lost while a sandbox runs. The run goes on in a fresh
sandbox (contexts reloaded, the model told its variables were lost, and why); when the daemon
stays out of reach the sandbox layer ends with an error that names the lost connection.

Real Docker behind a unix-socket forwarder the test can sever (tests/fixtures_chaos.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import docker
import pytest

from rlm_mcp.errors import ConnectionLostError, SandboxError
from rlm_mcp.ports import LMRequest
from rlm_mcp.sandbox.recovery import MAX_CONNECTION_RESTARTS
from rlm_mcp.testing.sandboxes import pool_ready
from tests.fixtures_chaos import CuttableDockerSocket
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_sandbox import no_bridge, ready_manager, text_context

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

DIRECT_SOCKET = "unix:///var/run/docker.sock"  # what the forwarder forwards to
MISLEADING = ("RLM_MCP_SANDBOX_MEMORY", "runs python3", "internal error", "Docker is not running", "exit status")


@pytest.fixture
def proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CuttableDockerSocket]:
    cuttable = CuttableDockerSocket(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", cuttable.url)
    yield cuttable
    cuttable.close()


def _remove_owned(owner: str) -> None:
    client = docker.DockerClient(base_url=DIRECT_SOCKET)
    try:
        for info in client.api.containers(all=True, filters={"label": f"rlm-mcp.owner={owner}"}):
            client.api.remove_container(info["Id"], force=True)
    finally:
        client.close()


def _says_connection_lost(text: str, words: str = "connection to the container engine was lost") -> None:
    """The model's notice speaks of the engine in neutral words; the run's final error, the
    backend's own (`words`), names the Docker daemon and its fix."""
    assert words in text, text
    for wrong in MISLEADING:
        assert wrong not in text, text


async def test_a_cell_whose_connection_is_cut_continues_in_a_fresh_sandbox(
    tmp_path: Path, proxy: CuttableDockerSocket
) -> None:
    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, "the context")]) as sb:
        r = await sb.execute("x = 41", no_bridge)
        assert r.error is None
        proxy.sever()  # the attach stream and every API connection drop at once
        r = await sb.execute("print(x + 1)", no_bridge)
        assert r.restarted and r.notice and "all variables were lost; contexts reloaded" in r.notice
        _says_connection_lost(r.notice)
        r = await sb.execute("print(context)", no_bridge)
        assert r.error is None and r.stdout == "the context\n" and not r.restarted
    assert sandbox_container_ids(mgr.owner_id) == set()


async def test_a_connection_cut_during_the_cell_itself_is_recognised(
    tmp_path: Path, proxy: CuttableDockerSocket
) -> None:
    async def cut_while_the_cell_waits(request: LMRequest) -> list[str]:
        proxy.sever()  # the cell's code is inside llm_query right now
        return ["too late"] * len(request.prompts)

    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        r = await sb.execute("x = llm_query('hello')\nprint(x)", cut_while_the_cell_waits)
        assert r.restarted and r.notice and "too late" not in r.stdout
        _says_connection_lost(r.notice)
        r = await sb.execute("print(len(context))", no_bridge)
        assert r.error is None and r.stdout == "3\n"


async def test_a_sandbox_whose_connection_drops_while_loading_the_contexts_is_replaced(
    tmp_path: Path, proxy: CuttableDockerSocket
) -> None:
    # A pooled container's stream dies under it (a cut while it waited): the open retries.
    async with ready_manager(pool_size=1) as mgr:
        with anyio.fail_after(60):
            while pool_ready(mgr) < 1:
                await anyio.sleep(0.05)
        proxy.sever()
        async with mgr.open([text_context(tmp_path, "loaded after the cut")]) as sb:
            r = await sb.execute("print(context)", no_bridge)
            assert r.error is None and r.stdout == "loaded after the cut\n"


async def test_a_daemon_that_stays_unreachable_ends_with_an_accurate_error(
    tmp_path: Path, proxy: CuttableDockerSocket
) -> None:
    owner = ""
    try:
        async with ready_manager(pool_size=0) as mgr:
            owner = mgr.owner_id
            async with mgr.open([text_context(tmp_path, "ctx")]) as sb:
                assert (await sb.execute("x = 1", no_bridge)).error is None
                proxy.close()  # cut, and no new connection can be made
                with pytest.raises(SandboxError) as raised, anyio.fail_after(120):
                    await sb.execute("print(x)", no_bridge)
    finally:  # the manager could not remove its (exited) container through the dead socket
        await anyio.to_thread.run_sync(_remove_owned, owner)
        assert isinstance(raised.value, ConnectionLostError)
        _says_connection_lost(str(raised.value), "connection to the Docker daemon was lost")
        assert f"{MAX_CONNECTION_RESTARTS + 1} attempts in a row" in str(raised.value)
        assert "DOCKER_HOST" in str(raised.value)
