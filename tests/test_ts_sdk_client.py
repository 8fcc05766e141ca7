"""The protocol-era scenario (load a folder, rlm_complete with progress, rlm_start + rlm_status +
rlm_result, rlm_cancel, a resource read) with the official TypeScript SDK client
(`@modelcontextprotocol/sdk`, pinned in tests/js/package.json; handshake era, 2025-11-25), the
client desktop apps are built on, on Node, against the real console script over stdio and over
streamable HTTP."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, minimal_env, sandbox_container_ids
from tests.fixtures_js import js_tools
from tests.test_protocol_eras import SCRIPT

pytestmark = pytest.mark.docker

SCENARIO = Path(__file__).parent / "clients" / "ts_sdk_scenario.mjs"


def _node(*args: str) -> list[str]:
    node = shutil.which("node")
    assert node, "Node.js is a prerequisite of the test suite (README, Tests)."
    return [node, str(SCENARIO), str(js_tools() / "node_modules"), *args]


def _check(seen: dict[str, Any], instance_id: str) -> None:
    assert seen["protocol"] == "2025-11-25"
    assert seen["complete"]["status"] == "completed" and seen["complete"]["answer"].startswith("files:")
    assert seen["progress"] >= 1
    assert seen["status"] in ("running", "completed")
    assert seen["result"]["status"] == "completed"
    assert seen["cancelled"]["status"] == "cancelled"
    assert seen["resource"]["context_id"]
    assert sandbox_container_ids(instance_id) == set()


def test_ts_sdk_client_over_stdio(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(f"{name}\n")
    command = _node()
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        spec = json.dumps({"command": str(SERVER_SCRIPT), "args": [], "env": env})
        run = subprocess.run(
            [*command, "stdio", spec, str(folder)], capture_output=True, text=True, timeout=600, check=False
        )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    _check(seen, env["RLM_MCP_INSTANCE_ID"])


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


@pytest.mark.anyio
async def test_ts_sdk_client_over_streamable_http(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "c.txt").write_text("c\n")
    command = _node()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        server = subprocess.Popen(
            [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await wait_until(lambda: _port_open(port) or server.poll() is not None, within_s=120, what="HTTP server up")
            assert server.poll() is None, "the HTTP server exited"
            run = await anyio.run_process([*command, "http", f"http://127.0.0.1:{port}/mcp", str(folder)], check=False)
        finally:
            server.terminate()
            await anyio.to_thread.run_sync(server.wait, 60)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    seen = json.loads(run.stdout.decode().strip().splitlines()[-1])
    _check(seen, env["RLM_MCP_INSTANCE_ID"])
