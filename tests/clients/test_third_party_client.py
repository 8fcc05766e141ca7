"""A real third-party MCP client: the MCP Inspector's CLI mode (Node, from the npm registry)
lists the tools of the installed `rlm-mcp` console script and calls `rlm_load_context`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures_e2e import SERVER_SCRIPT

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def inspector(tmp_path: Path, *args: str) -> dict:
    npx = shutil.which("npx")
    assert npx, "npx (Node.js) is needed for the third-party client test; install nodejs and npm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_MCP_")}
    command = [
        npx,
        "-y",
        INSPECTOR,
        "--cli",
        "-e",
        f"RLM_MCP_DATA_DIR={tmp_path / 'data'}",
        "-e",
        f"RLM_MCP_ALLOWED_ROOTS={tmp_path}",
        "-e",
        "RLM_MCP_LOG_LEVEL=WARNING",
        str(SERVER_SCRIPT),
        *args,
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def test_inspector_lists_tools(tmp_path: Path) -> None:
    listing = inspector(tmp_path, "--method", "tools/list")
    names = {tool["name"] for tool in listing["tools"]}
    assert {"rlm_load_context", "rlm_upload_context", "rlm_complete", "rlm_start", "rlm_cancel"} <= names
    complete = next(t for t in listing["tools"] if t["name"] == "rlm_complete")
    # Only the query is required: a kept session's follow-up may add no context.
    assert set(complete["inputSchema"]["required"]) == {"query"}
    assert {"context_id", "keep_session", "session_id"} <= set(complete["inputSchema"]["properties"])
    assert {"rlm_list_sessions", "rlm_close_session"} <= names


def test_inspector_loads_a_file_context(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("inspector was here\n", encoding="utf-8")
    result = inspector(
        tmp_path, "--method", "tools/call", "--tool-name", "rlm_load_context", "--tool-arg", f"path={notes}"
    )
    assert result["isError"] is False
    assert result["structuredContent"]["bytes"] == notes.stat().st_size
    assert result["structuredContent"]["context_id"].startswith("ctx_")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__]))
