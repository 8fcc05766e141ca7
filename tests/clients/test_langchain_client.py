"""LangChain's `langchain-mcp-adapters`, pinned, with its own `mcp` 1.x (handshake era) in an
environment of its own (uv venv; it does not constrain the server's `mcp`), calling rlm-mcp's
tools through LangChain tool objects over stdio and streamable HTTP: load a folder, rlm_complete with progress,
rlm_start + rlm_status + rlm_result, rlm_cancel, a resource read (as LangChain blobs), against
the real console script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from tests.clients.test_protocol_eras import MCP1, SCRIPT, assert_scenario
from tests.fixtures_e2e import SERVER_SCRIPT, assert_no_sandboxes_left, minimal_env
from tests.fixtures_uv import uv_path
from tests.paths import TESTS

ADAPTERS = "langchain-mcp-adapters==0.3.2"
LANGCHAIN_CORE = "langchain-core==1.7.2"
SCENARIO = TESTS / "clients" / "langchain_scenario.py"


@pytest.fixture(scope="module")
def langchain_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("langchain") / "venv"
    subprocess.run([uv_path(), "venv", "-q", "--python", "3.11", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [uv_path(), "pip", "install", "-q", "--python", python, ADAPTERS, LANGCHAIN_CORE, MCP1],
        check=True,
        timeout=600,
    )
    return python


def test_langchain_tools_over_stdio(langchain_python: str, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(f"{name}\n")
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        spec = json.dumps({"command": str(SERVER_SCRIPT), "args": [], "env": env})
        run = subprocess.run(
            [langchain_python, str(SCENARIO), "stdio", spec, str(folder)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert run.returncode == 0, run.stderr[-3000:]
    _check(json.loads(run.stdout.strip().splitlines()[-1]), env["RLM_MCP_INSTANCE_ID"])


def _check(seen: dict[str, Any], instance_id: str) -> None:
    assert seen["mcp"] == MCP1.split("==")[1] and seen["adapters"] == ADAPTERS.split("==")[1]
    assert seen["is_base_tool"] is True
    assert_scenario(seen, None)  # the adapters do not report the negotiated version
    assert seen["result"]["answer"].startswith("files:")
    assert_no_sandboxes_left(instance_id)


@pytest.mark.anyio
async def test_langchain_tools_over_streamable_http(langchain_python: str, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "c.txt").write_text("c\n")
    port = free_port()
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        serve = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
        with server_process(serve, port=port, env=env, within_s=120):
            run = await anyio.run_process(
                [langchain_python, str(SCENARIO), "http", f"http://127.0.0.1:{port}/mcp", str(folder)], check=False
            )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    _check(json.loads(run.stdout.decode().strip().splitlines()[-1]), env["RLM_MCP_INSTANCE_ID"])
