"""Chaos (issue 14 item 12): while several runs execute, sandboxes are killed, the LM endpoint
goes away and comes back, and the Docker connection is cut, at random points. Every run must end
with a structured status, the server must keep answering (and run again afterwards), and no
container of this test's server nor any temp file may be left.

Real parts: the in-memory MCP client, real Docker behind a socket the test can cut, the scripted
LM on a fixed loopback port. The seed is printed on failure (RLM_MCP_CHAOS_SEED replays it)."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest
from mcp import Client

from rlm_mcp.sandbox.recovery import MAX_CONNECTION_RESTARTS
from rlm_mcp.server.app import build_server
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port
from tests.fixtures_chaos import CuttableDockerSocket
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_surface import call, make_settings

pytestmark = pytest.mark.anyio

BUSY_TURN = """```repl
import time
parts = llm_query_batched(["summarise part a", "summarise part b"])
time.sleep(0.3)
print(len(parts))
```"""
ENDED = {"completed", "max_iterations", "timeout", "budget_exceeded", "error", "cancelled"}
RUNS = 4
# Reasons that misname a dropped Docker connection (memory, image, a bug, a daemon that is down).
MISLEADING = ("internal error", "Docker is not running", "RLM_MCP_SANDBOX_MEMORY", "runs python3", "Traceback")
DOCKER_LOST = "connection to the Docker daemon was lost"  # the backend's final error
ENGINE_LOST = "connection to the container engine was lost"  # a sandbox's death, told to the model


def check_reason(result: dict[str, Any], context: str, *, daemon_reachable: bool = True) -> None:
    """An ended run's reason is accurate: nothing misleading, and while the daemon stays reachable a
    lost Docker connection is never why a run failed (the run goes on in a fresh sandbox)."""
    reason = str(result.get("reason") or "")
    if result["status"] == "error":
        assert reason, f"{context}: an error without a reason: {result}"
    for wrong in MISLEADING:
        assert wrong not in reason, f"{context}: a misleading reason: {result}"
    if daemon_reachable and result["status"] == "error":
        for lost in (DOCKER_LOST, ENGINE_LOST):
            assert lost not in reason, f"{context}: the run ended although the daemon was reachable: {result}"


def running_sandboxes(instance_id: str) -> list[str]:
    client = docker.from_env()
    try:
        found = client.api.containers(filters={"label": f"rlm-mcp.owner={instance_id}", "status": "running"})
        return [c["Id"] for c in found]
    finally:
        client.close()


def remove_owned(instance_id: str) -> None:
    client = docker.from_env()
    try:
        for info in client.api.containers(all=True, filters={"label": f"rlm-mcp.owner={instance_id}"}):
            client.api.remove_container(info["Id"], force=True)
    finally:
        client.close()


async def wait_ended(client: Client, run_id: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with anyio.fail_after(240):
        while result.get("status") not in ENDED:
            result = await call(client, "rlm_result", run_id=run_id, wait_s=30)
    assert result["run_id"] == run_id
    return result


def kill_one_sandbox(instance_id: str, rng: random.Random) -> bool:
    client = docker.from_env()
    try:
        running = client.containers.list(filters={"label": f"rlm-mcp.owner={instance_id}", "status": "running"})
        if not running:
            return False
        rng.choice(running).kill()
        return True
    except docker.errors.APIError:
        return False  # it ended by itself meanwhile
    finally:
        client.close()


async def test_runs_survive_killed_sandboxes_lm_and_docker_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = int(os.environ.get("RLM_MCP_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    own_tmp = tmp_path / "systmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))  # temp files of this server land here
    proxy = CuttableDockerSocket(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", proxy.url)
    port = free_port("127.0.0.1")
    script = Script(root=[BUSY_TURN])
    lm = ScriptedLM(script, port=port).start()
    actions: list[str] = []
    try:
        settings = make_settings(tmp_path, lm.base_url, lm_retries=2, max_iterations=15)
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="chaos context " * 100)
            run_ids = [
                (await call(client, "rlm_start", query=f"q{i}", context_id=ctx["context_id"], timeout_s=120))["run_id"]
                for i in range(RUNS)
            ]
            for _ in range(8):
                await anyio.sleep(rng.uniform(0.3, 1.5))
                action = rng.choice(["sandbox", "lm", "docker"])
                if action == "docker" and actions.count("docker connection cut") >= MAX_CONNECTION_RESTARTS - 1:
                    # A run may lose more cuts in a row than it restarts for (its cells between them
                    # are slow under load): then it rightly ends, which `check_reason` forbids here.
                    action = rng.choice(["sandbox", "lm"])
                if action == "sandbox":
                    killed = await anyio.to_thread.run_sync(kill_one_sandbox, str(settings.sandbox.instance_id), rng)
                    actions.append("kill sandbox" if killed else "no sandbox to kill")
                elif action == "lm":
                    lm.stop()
                    await anyio.sleep(rng.uniform(0.2, 2.0))
                    lm = ScriptedLM(script, port=port).start()
                    actions.append("LM down and up")
                else:
                    proxy.sever()
                    actions.append("docker connection cut")
                listed = await client.call_tool("rlm_list_contexts", {})
                assert not listed.is_error, f"seed {seed}, after {actions}: the server stopped answering"

            ended: list[str] = []
            statuses = [(await call(client, "rlm_status", run_id=r))["status"] for r in run_ids]
            for run_id in run_ids:
                result = await wait_ended(client, run_id)
                check_reason(result, f"seed {seed}, {actions}")
                ended.append(f"{result['status']} ({str(result.get('reason'))[:160]})")

            print(f"chaos seed {seed}: {actions}; right after: {statuses}; ended: {ended}")
            # Still serving, and able to run again on the same Docker and LM.
            again = await call(client, "rlm_complete", query="again", context_id=ctx["context_id"], max_iterations=1)
            assert again["status"] in ENDED - {"error"}, f"seed {seed}, {actions}: {again}"
        assert sandbox_container_ids(str(settings.sandbox.instance_id)) == set(), f"seed {seed}, {actions}"
        assert not list(own_tmp.iterdir()), f"seed {seed}, {actions}: temp files left"
        assert not list((Path(settings.store.data_dir) / "tmp").iterdir()), f"seed {seed}: store temp files left"
    finally:
        lm.stop()
        proxy.close()


async def test_runs_whose_docker_connection_is_cut_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the Docker connection is cut (attach streams and API calls), repeatedly, while the daemon
    stays reachable: every run completes its iterations in fresh sandboxes."""
    seed = int(os.environ.get("RLM_MCP_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    proxy = CuttableDockerSocket(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", proxy.url)
    lm = ScriptedLM(Script(root=[BUSY_TURN]), port=free_port("127.0.0.1")).start()
    try:
        settings = make_settings(tmp_path, lm.base_url, lm_retries=2, max_iterations=8)
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="cut context " * 100)
            run_ids = [
                (await call(client, "rlm_start", query=f"q{i}", context_id=ctx["context_id"], timeout_s=120))["run_id"]
                for i in range(3)
            ]
            for _ in range(3):
                await anyio.sleep(rng.uniform(0.3, 1.5))  # a random point of the runs, not a synchronisation
                proxy.sever()
            results = [await wait_ended(client, run_id) for run_id in run_ids]
            for result in results:
                check_reason(result, f"seed {seed}")
                assert result["status"] == "max_iterations", f"seed {seed}: {result}"
        assert proxy.severed == 3
        assert sandbox_container_ids(str(settings.sandbox.instance_id)) == set(), f"seed {seed}"
    finally:
        lm.stop()
        proxy.close()


async def test_runs_end_with_an_accurate_reason_when_the_daemon_stays_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = CuttableDockerSocket(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", proxy.url)
    lm = ScriptedLM(Script(root=[BUSY_TURN]), port=free_port("127.0.0.1")).start()
    settings = make_settings(tmp_path, lm.base_url, lm_retries=2, max_iterations=50)
    try:
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="unreachable " * 100)
            run_id = (await call(client, "rlm_start", query="q", context_id=ctx["context_id"], timeout_s=180))["run_id"]
            with anyio.fail_after(60):
                while (await call(client, "rlm_status", run_id=run_id)).get("iterations", 0) < 1:
                    await anyio.sleep(0.1)
            proxy.close()  # cut, and no new connection can be made
            result = await wait_ended(client, run_id)
            check_reason(result, "unreachable", daemon_reachable=False)
            assert result["status"] == "error" and DOCKER_LOST in result["reason"], result
            assert "DOCKER_HOST" in result["reason"], result
            listed = await client.call_tool("rlm_list_contexts", {})
            assert not listed.is_error, "the server stopped answering"
    finally:
        lm.stop()
        proxy.close()
        monkeypatch.undo()  # DOCKER_HOST back to the real daemon
    try:
        # Its attach stream gone, the sandbox stopped by itself (StdinOnce) though nobody could remove it.
        with anyio.fail_after(60):
            while await anyio.to_thread.run_sync(running_sandboxes, str(settings.sandbox.instance_id)):
                await anyio.sleep(0.2)
    finally:  # the server could not remove its exited container through the dead socket
        await anyio.to_thread.run_sync(remove_owned, str(settings.sandbox.instance_id))
