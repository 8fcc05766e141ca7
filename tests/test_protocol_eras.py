"""The same scenario (load a folder, rlm_complete with progress, rlm_start + rlm_status +
rlm_result, rlm_cancel, a resource read) with the Python `mcp` 1.x client of the handshake era,
in an environment of its own (uv venv, pinned), against the real console script over stdio."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest

from rlm_mcp.testing.script import Fault, RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from tests.fixtures_e2e import SERVER_SCRIPT, assert_no_sandboxes_left, minimal_env
from tests.fixtures_uv import uv_path

pytestmark = pytest.mark.docker

MCP1 = "mcp==1.30.0"  # the last 1.x here; handshake era (protocol 2025-11-25)
SCENARIO = Path(__file__).parent / "clients" / "mcp1_scenario.py"
ANSWER = '```repl\nanswer["content"] = "files:" + str(len(context))\nanswer["ready"] = True\n```'
SCRIPT = Script(
    root_by_query=[
        RootScript(match="Q-slow", replies=["```repl\nprint(1)\n```"]),
        RootScript(match="Q-ok", replies=[ANSWER]),
    ],
    faults=[Fault(when="root", match="Q-slow", delay_s=120, times=0)],
)


@pytest.fixture(scope="module")
def mcp1_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("mcp1") / "venv"
    subprocess.run([uv_path(), "venv", "-q", "--python", "3.11", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run([uv_path(), "pip", "install", "-q", "--python", python, MCP1], check=True, timeout=600)
    return python


def test_mcp1_client_over_stdio(mcp1_python: str, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(f"{name}\n")
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        spec = json.dumps({"command": str(SERVER_SCRIPT), "args": [], "env": env})
        run = subprocess.run(
            [mcp1_python, str(SCENARIO), "stdio", spec, str(folder)], capture_output=True, text=True, timeout=600
        )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["protocol"] == "2025-11-25"
    assert seen["complete"]["status"] == "completed" and seen["complete"]["answer"].startswith("files:")
    assert seen["progress"] >= 1
    assert seen["status"] in ("running", "completed")
    assert seen["result"]["status"] == "completed"
    assert seen["cancelled"]["status"] == "cancelled"
    assert seen["resource"]["context_id"]
    assert_no_sandboxes_left(env["RLM_MCP_INSTANCE_ID"])


@pytest.mark.anyio
async def test_mcp1_client_over_streamable_http(mcp1_python: str, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "c.txt").write_text("c\n")
    port = free_port()
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        serve = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
        with server_process(serve, port=port, env=env, within_s=120):
            run = await anyio.run_process(
                [mcp1_python, str(SCENARIO), "http", f"http://127.0.0.1:{port}/mcp", str(folder)], check=False
            )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    seen = json.loads(run.stdout.decode().strip().splitlines()[-1])
    assert seen["protocol"] == "2025-11-25"
    assert seen["complete"]["status"] == "completed" and seen["progress"] >= 1
    assert seen["result"]["status"] == "completed" and seen["cancelled"]["status"] == "cancelled"
    assert seen["resource"]["context_id"]
    assert_no_sandboxes_left(env["RLM_MCP_INSTANCE_ID"])
