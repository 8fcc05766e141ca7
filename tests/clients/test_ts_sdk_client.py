"""The protocol-era scenario (load a folder, rlm_complete with progress, rlm_start + rlm_status +
rlm_result, rlm_cancel, a resource read) with the official TypeScript SDK client
(`@modelcontextprotocol/sdk`, pinned in tests/js/package.json; handshake era, 2025-11-25), the
client desktop apps are built on, on Node, against the real console script over stdio and over
streamable HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from tests.clients.test_protocol_eras import SCRIPT, assert_scenario
from tests.fixtures_e2e import SERVER_SCRIPT, assert_no_sandboxes_left, minimal_env
from tests.fixtures_js import js_tools
from tests.paths import TESTS

SCENARIO = TESTS / "clients" / "ts_sdk_scenario.mjs"


def _node(*args: str) -> list[str]:
    node = shutil.which("node")
    assert node, "Node.js is a prerequisite of the test suite (docs/getting-started.md, Install)."
    return [node, str(SCENARIO), str(js_tools() / "node_modules"), *args]


def _check(seen: dict[str, Any], instance_id: str) -> None:
    assert_scenario(seen, "2025-11-25")
    assert_no_sandboxes_left(instance_id)


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


@pytest.mark.anyio
async def test_ts_sdk_client_over_streamable_http(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "c.txt").write_text("c\n")
    command = _node()
    port = free_port()
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        serve = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
        with server_process(serve, port=port, env=env, within_s=120):
            run = await anyio.run_process([*command, "http", f"http://127.0.0.1:{port}/mcp", str(folder)], check=False)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    seen = json.loads(run.stdout.decode().strip().splitlines()[-1])
    _check(seen, env["RLM_MCP_INSTANCE_ID"])
