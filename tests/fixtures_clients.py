"""The scenario every third-party MCP client runs against the real console script (load a
folder, rlm_complete with progress, rlm_start + rlm_status + rlm_result, rlm_cancel, a resource
read): the scripted LM it runs against, how a client's scenario script is started over stdio or
streamable HTTP, what it must have seen, and a pinned client's environment of its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.testing.script import Fault, RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from tests.fixtures_e2e import SERVER_SCRIPT, minimal_env
from tests.fixtures_uv import make_venv

MCP1 = "mcp==1.30.0"  # the last 1.x here; handshake era (protocol 2025-11-25)
ANSWER = '```repl\nanswer["content"] = "files:" + str(len(context))\nanswer["ready"] = True\n```'
SCRIPT = Script(
    root_by_query=[
        RootScript(match="Q-slow", replies=["```repl\nprint(1)\n```"]),
        RootScript(match="Q-ok", replies=[ANSWER]),
    ],
    faults=[Fault(when="root", match="Q-slow", delay_s=120, times=0)],
)


def client_venv(tmp_path_factory: pytest.TempPathFactory, name: str, *requirements: str) -> str:
    """The Python of a fresh uv environment holding `requirements` (a client pinned with its own
    `mcp`, which must not constrain the server's)."""
    return str(make_venv(tmp_path_factory.mktemp(name) / "venv", *requirements, python="3.11"))


def _folder(tmp_path: Path, names: tuple[str, ...]) -> Path:
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"{name}\n")
    return folder


def scenario_over_stdio(command: list[str], tmp_path: Path) -> tuple[dict[str, Any], str]:
    """Run a client's scenario script (`command`, then `stdio SPEC FOLDER`) against the console
    script over stdio: what it saw (its last line of JSON), and the server's instance id."""
    folder = _folder(tmp_path, ("a.txt", "b.txt"))
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        spec = json.dumps({"command": str(SERVER_SCRIPT), "args": [], "env": env})
        run = subprocess.run(
            [*command, "stdio", spec, str(folder)], capture_output=True, text=True, timeout=600, check=False
        )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), env["RLM_MCP_INSTANCE_ID"]


async def scenario_over_http(command: list[str], tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The same (`command`, then `http URL FOLDER`) against `rlm-mcp serve --transport http`."""
    folder = _folder(tmp_path, ("c.txt",))
    port = free_port()
    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        serve = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
        with server_process(serve, port=port, env=env, within_s=120):
            run = await anyio.run_process([*command, "http", f"http://127.0.0.1:{port}/mcp", str(folder)], check=False)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    return json.loads(run.stdout.decode().strip().splitlines()[-1]), env["RLM_MCP_INSTANCE_ID"]


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
