"""Each client snippet of the docs (docs/clients.md; the README repeats the Python one) starts the
server as written (the checkout's path filled in): the JSON configs and Claude Code's command
through the real MCP client, the Inspector's commands through the Inspector itself (one-shot over
stdio; rlm_start then rlm_result over HTTP), the Python snippet run as a script."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from tests.fixtures_e2e import new_instance_id
from tests.fixtures_uv import REPO, user_env, uv_path
from tests.readme_blocks import README, Block, blocks

PLACEHOLDER = "/path/to/rlm-mcp"
ANSWER = '```repl\nanswer["content"] = "snippet:" + context.strip()\nanswer["ready"] = True\n```'
CLIENTS = ("claude-desktop", "cursor", "windsurf", "vscode", "claude-code", "inspector-stdio", "inspector-http")


def snippet(client: str) -> Block:
    found = [b for b in blocks() if b.marker == f"<!-- client: {client} -->"]
    assert len(found) == 1, f"the docs need exactly one snippet marked <!-- client: {client} -->: {found}"
    return found[0]


def server_command(client: str) -> list[str]:
    """The command line a client would launch, from its snippet, with the checkout's path."""
    block = snippet(client)
    text = block.text.replace(PLACEHOLDER, str(REPO))
    if block.lang == "json":
        config = json.loads(text)
        entry = (config.get("mcpServers") or config["servers"])["rlm"]
        assert entry.get("type", "stdio") == "stdio"
        return [entry["command"], *entry["args"]]
    argv = shlex.split(text.replace("\\\n", " "))
    return argv[argv.index("--") + 1 :]


@pytest.fixture(scope="module")
def lm() -> Iterator[ScriptedLM]:
    with ScriptedLM(Script(root=[ANSWER])) as server:
        yield server


@pytest.fixture(scope="module")
def project_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uv") / "venv"


def env_for(lm: ScriptedLM, project_env: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    return user_env(
        project_env,
        RLM_MCP_BASE_URL=lm.base_url,
        RLM_MCP_DATA_DIR=str(tmp_path / "data"),
        RLM_MCP_ALLOWED_ROOTS=str(tmp_path),
        RLM_MCP_POOL_SIZE="0",
        RLM_MCP_LOG_LEVEL="WARNING",
        RLM_MCP_INSTANCE_ID=new_instance_id(),
        **extra,
    )


def test_every_client_has_a_snippet_for_a_checkout() -> None:
    for client in (*CLIENTS, "python"):
        assert PLACEHOLDER in snippet(client).text, client


def test_the_readme_shows_the_clients_pages_python_snippet() -> None:
    (shown,) = [b for b in blocks(README) if b.marker.startswith("<!-- client: python")]
    assert shown.text == snippet("python").text, "README.md's Python client must be docs/clients.md's"


def test_python_snippet_completes_a_run(lm: ScriptedLM, project_env: Path, tmp_path: Path) -> None:
    # Run as a user would: the script beside their work, the server's settings in their shell.
    script = tmp_path / "client.py"
    script.write_text(snippet("python").text.replace(PLACEHOLDER, str(REPO)))
    env = env_for(lm, project_env, tmp_path)
    proc = subprocess.run(
        [uv_path(), "run", "--project", str(REPO), "python", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip() == "completed snippet:alpha\nbeta\ngamma", proc.stdout


def test_python_snippet_shows_a_tool_error_when_the_lm_is_down(
    lm: ScriptedLM, project_env: Path, tmp_path: Path
) -> None:
    # A reader's first run often has no endpoint yet: the snippet prints why, not a TypeError.
    script = tmp_path / "client.py"
    script.write_text(snippet("python").text.replace(PLACEHOLDER, str(REPO)))
    env = {**env_for(lm, project_env, tmp_path), "RLM_MCP_BASE_URL": "http://127.0.0.1:9/v1"}  # nothing listens
    proc = subprocess.run(
        [uv_path(), "run", "--project", str(REPO), "python", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("error: ") and "127.0.0.1:9" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.anyio
@pytest.mark.parametrize("client", ["claude-desktop", "cursor", "windsurf", "vscode", "claude-code"])
async def test_snippet_command_serves_mcp(client: str, lm: ScriptedLM, project_env: Path, tmp_path: Path) -> None:
    command = server_command(client)
    assert command[0] == "uv", command
    params = StdioServerParameters(command=uv_path(), args=command[1:], env=env_for(lm, project_env, tmp_path))
    async with Client(params) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"rlm_load_context", "rlm_complete", "rlm_start", "rlm_result"} <= names
        loaded = await session.call_tool("rlm_load_context", {"text": "hello"})
        assert loaded.structured_content is not None and loaded.structured_content["bytes"] == 5


def run_inspector(command: str, env: dict[str, str], cwd: Path) -> dict:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def test_inspector_stdio_snippet_lists_tools(lm: ScriptedLM, project_env: Path, tmp_path: Path) -> None:
    command = snippet("inspector-stdio").text.replace(PLACEHOLDER, str(REPO))
    listing = run_inspector(command, env_for(lm, project_env, tmp_path), tmp_path)
    assert "rlm_complete" in {tool["name"] for tool in listing["tools"]}


def test_inspector_stdio_snippet_hands_its_settings_to_the_server(
    lm: ScriptedLM, project_env: Path, tmp_path: Path
) -> None:
    # The Inspector starts a stdio server without the shell's RLM_MCP_*: the snippet's `-e` is
    # what reaches it. A bad value given the same way stops the server, naming it.
    command = snippet("inspector-stdio").text.replace(PLACEHOLDER, str(REPO))
    assert "-e RLM_MCP_BASE_URL=" in command
    bad = command.replace("-e RLM_MCP_BASE_URL=", "-e RLM_MCP_MAX_ITERATIONS=lots -e RLM_MCP_BASE_URL=")
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", bad],
        env=env_for(lm, project_env, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode != 0 and "RLM_MCP_MAX_ITERATIONS" in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_inspector_http_snippet_starts_then_polls_a_run(lm: ScriptedLM, project_env: Path, tmp_path: Path) -> None:
    serve_line, *inspector_lines = snippet("inspector-http").text.replace(PLACEHOLDER, str(REPO)).splitlines()
    port = free_port()
    env = env_for(lm, project_env, tmp_path, RLM_MCP_PORT=str(port))
    serve = shlex.split(serve_line.split("&")[0])
    assert serve[0] == "uv"
    with server_process([uv_path(), *serve[1:]], port=port, env=env, cwd=tmp_path, within_s=120, quiet=False):
        inspector = " ".join(line.rstrip("\\ ") for line in inspector_lines).replace(":8765/", f":{port}/")
        base = inspector[: inspector.index("--method")]

        def call(tool: str, *args: str) -> dict:
            quoted = " ".join(shlex.quote(f"{a}") for a in args)
            result = run_inspector(f"{base} --method tools/call --tool-name {tool} {quoted}", env, tmp_path)
            assert result["isError"] is False, result
            return result["structuredContent"]

        context_id = call("rlm_load_context", "--tool-arg", "text=polled")["context_id"]
        as_written = re.sub(r"context_id=\S+", f"context_id={context_id}", inspector)
        started = run_inspector(as_written, env, tmp_path)
        assert started["isError"] is False, started
        run_id = started["structuredContent"]["run_id"]
        result = call("rlm_result", "--tool-arg", f"run_id={run_id}", "--tool-arg", "wait_s=60")
        assert result["status"] == "completed" and result["answer"] == "snippet:polled", result
