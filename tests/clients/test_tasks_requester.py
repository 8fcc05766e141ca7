"""The official MCP Tasks requester (`@modelcontextprotocol/ext-tasks` 0.2.2 on the TypeScript SDK
v2 client, Node 24) against rlm-mcp over streamable HTTP at 2026-07-28 (issue 40 item 1): an
`rlm_complete` it calls becomes a task that completes with the answer, and one it cancels ends
cancelled. tests/clients/ext_tasks_scenario.mjs is the client; a real server on loopback with a
token, real Docker sandboxes, the scripted LM."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port
from tests.fixtures_conformance import node24_installed, node_bin
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_http import as_token, serving
from tests.fixtures_js import JS_DIR
from tests.fixtures_surface import ANSWER_NOW, STUCK, call, make_settings
from tests.paths import TESTS

pytestmark = pytest.mark.anyio

SCENARIO = TESTS / "clients" / "ext_tasks_scenario.mjs"
TOKEN = "ext-tasks-token"


def scenario_command(tmp_path: Path) -> list[str]:
    """Node 24 running the scenario beside the pinned packages (ESM resolves from the file)."""
    tools = node24_installed(JS_DIR / "tasks")
    folder = tmp_path / "client"
    folder.mkdir()
    (folder / "node_modules").symlink_to(tools / "node_modules")
    shutil.copy(SCENARIO, folder / SCENARIO.name)
    return [str(node_bin() / "node"), str(folder / SCENARIO.name)]


async def test_the_official_requester_completes_and_cancels_a_task(tmp_path: Path) -> None:
    command = scenario_command(tmp_path)
    script = Script(
        root_by_query=[RootScript(match="STUCK-Q", replies=[STUCK]), RootScript(match="OK-Q", replies=[ANSWER_NOW])]
    )
    with ScriptedLM(script) as lm:
        settings = make_settings(
            tmp_path, lm.base_url, host="127.0.0.1", port=free_port("127.0.0.1"), auth_tokens=[TOKEN]
        )
        async with serving(settings) as url, as_token(url, TOKEN) as client:
            context_id = (await call(client, "rlm_load_context", text="c"))["context_id"]
            done = await anyio.to_thread.run_sync(
                lambda: subprocess.run([*command, url, TOKEN, context_id], capture_output=True, text=True, timeout=300)
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            slow = await call(client, "rlm_status", run_id=seen["slowTaskId"])
    assert seen["era"] == "modern" and seen["kind"] == "task", seen
    assert seen["outcome"] == "completed", seen
    assert seen["result"]["structuredContent"]["answer"] == "forty-two"
    assert seen["result"]["structuredContent"]["run_id"] == seen["taskId"]
    assert seen["lastTask"] == {"status": "completed", "retentionMs": settings.runs.run_max_age_days * 86_400_000}
    assert seen["slowKind"] == "task" and seen["cancelled"] == "cancelled"
    assert slow["status"] == "cancelled"  # the run itself, not only the requester's view
    assert settings.sandbox.instance_id is not None and not sandbox_container_ids(settings.sandbox.instance_id)
