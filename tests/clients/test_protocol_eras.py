"""The same scenario (load a folder, rlm_complete with progress, rlm_start + rlm_status +
rlm_result, rlm_cancel, a resource read) with each Python `mcp` client era, against the real
console script over stdio and streamable HTTP:

- the handshake era's `mcp` 1.x client (protocol 2025-11-25), in an environment of its own (uv
  venv, pinned), running tests/clients/mcp1_scenario.py;
- the `mcp` 2.x `Client` (protocol 2026-07-28, this project's own SDK), running
  tests/clients/mcp2_scenario.py: the same steps, the same JSON, the same assertions.

The TypeScript SDK and LangChain run this scenario in test_ts_sdk_client.py and
test_langchain_client.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.testing.script import Fault, RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from tests.fixtures_e2e import SERVER_SCRIPT, assert_no_sandboxes_left, minimal_env
from tests.fixtures_uv import uv_path
from tests.paths import TESTS

MCP1 = "mcp==1.30.0"  # the last 1.x here; handshake era (protocol 2025-11-25)
CLIENTS = TESTS / "clients"
ANSWER = '```repl\nanswer["content"] = "files:" + str(len(context))\nanswer["ready"] = True\n```'
SCRIPT = Script(
    root_by_query=[
        RootScript(match="Q-slow", replies=["```repl\nprint(1)\n```"]),
        RootScript(match="Q-ok", replies=[ANSWER]),
    ],
    faults=[Fault(when="root", match="Q-slow", delay_s=120, times=0)],
)


@dataclass(frozen=True)
class Era:
    python: str  # the interpreter whose `mcp` is the client
    scenario: Path
    protocol: str  # the revision the client and the server agree on


def _mcp1_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("mcp1") / "venv"
    subprocess.run([uv_path(), "venv", "-q", "--python", "3.11", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run([uv_path(), "pip", "install", "-q", "--python", python, MCP1], check=True, timeout=600)
    return python


@pytest.fixture(scope="module", params=["mcp1", "mcp2"])
def era(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Era:
    if request.param == "mcp1":
        return Era(_mcp1_python(tmp_path_factory), CLIENTS / "mcp1_scenario.py", "2025-11-25")
    return Era(sys.executable, CLIENTS / "mcp2_scenario.py", "2026-07-28")  # the project's own mcp 2.x


def assert_scenario(seen: dict[str, Any], protocol: str | None) -> None:
    """What every client's run of the shared scenario must have seen (`protocol`: the version
    negotiated, where the client reports one)."""
    if protocol is not None:
        assert seen["protocol"] == protocol
    assert seen["complete"]["status"] == "completed" and seen["complete"]["answer"].startswith("files:")
    assert seen["progress"] >= 1
    # Read right after rlm_start: the run may still be pinning its contexts before it takes its
    # slot (queued for a moment, more on a loaded machine), running, or already done.
    assert seen["status"] in ("queued", "running", "completed")
    assert seen["result"]["status"] == "completed"
    assert seen["cancelled"]["status"] == "cancelled"
    assert seen["resource"]["context_id"]


def test_client_era_over_stdio(era: Era, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(f"{name}\n")
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        spec = json.dumps({"command": str(SERVER_SCRIPT), "args": [], "env": env})
        run = subprocess.run(
            [era.python, str(era.scenario), "stdio", spec, str(folder)], capture_output=True, text=True, timeout=600
        )
    assert run.returncode == 0, run.stderr[-3000:]
    assert_scenario(json.loads(run.stdout.strip().splitlines()[-1]), era.protocol)
    assert_no_sandboxes_left(env["RLM_MCP_INSTANCE_ID"])


@pytest.mark.anyio
async def test_client_era_over_streamable_http(era: Era, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "c.txt").write_text("c\n")
    port = free_port()
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        serve = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
        with server_process(serve, port=port, env=env, within_s=120):
            run = await anyio.run_process(
                [era.python, str(era.scenario), "http", f"http://127.0.0.1:{port}/mcp", str(folder)], check=False
            )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    assert_scenario(json.loads(run.stdout.decode().strip().splitlines()[-1]), era.protocol)
    assert_no_sandboxes_left(env["RLM_MCP_INSTANCE_ID"])
