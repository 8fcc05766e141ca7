"""The Claude Code snippet of docs/clients.md, run as written with the real `claude` CLI (pinned in
tests/js/package.json; a temporary HOME, the autoupdater off), then read back with
`claude mcp get`, which also starts the server the way Claude Code will and connects to it."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from tests.fixtures_e2e import new_instance_id
from tests.fixtures_js import js_bin
from tests.fixtures_uv import REPO, user_env, uv_path
from tests.readme_blocks import blocks

PLACEHOLDER = "/path/to/rlm-mcp"


def claude_code_snippet() -> str:
    (block,) = [b for b in blocks() if b.marker == "<!-- client: claude-code -->"]
    return block.text.replace(PLACEHOLDER, str(REPO))


def test_the_claude_code_snippet_adds_a_server_that_connects(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = user_env(
        tmp_path / "venv",
        HOME=str(home),
        DISABLE_AUTOUPDATER="1",
        MCP_TIMEOUT="180000",  # the first `uv run` of a fresh project environment
        RLM_MCP_DATA_DIR=str(tmp_path / "data"),
        RLM_MCP_INSTANCE_ID=new_instance_id(),
        RLM_MCP_POOL_SIZE="0",
    )
    subprocess.run([uv_path(), "sync", "--project", str(REPO), "-q"], env=env, check=True, timeout=600)
    argv = shlex.split(claude_code_snippet().replace("\\\n", " "))
    assert argv[:3] == ["claude", "mcp", "add"], argv
    added = subprocess.run([js_bin("claude"), *argv[1:]], env=env, capture_output=True, text=True, timeout=300)
    assert added.returncode == 0, added.stdout + added.stderr
    assert "Added stdio MCP server rlm" in added.stdout

    config = json.loads((home / ".claude.json").read_text())["mcpServers"]["rlm"]
    assert config == {
        "type": "stdio",
        "command": "uv",
        "args": ["run", "--project", str(REPO), "rlm-mcp"],
        "env": {"RLM_MCP_BASE_URL": "http://localhost:8000/v1"},
    }

    got = subprocess.run([js_bin("claude"), "mcp", "get", "rlm"], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "Scope: User config" in got.stdout
    assert f"Args: run --project {REPO} rlm-mcp" in got.stdout
    assert "RLM_MCP_BASE_URL=http://localhost:8000/v1" in got.stdout
    assert "Connected" in got.stdout and "Failed" not in got.stdout, got.stdout
