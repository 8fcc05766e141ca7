"""Two rlm-mcp servers on one Docker daemon, as Claude Desktop, Claude Code and Cursor each
start their own: one server's start, runs, reaping and shutdown never touch the other's
containers, and each test counts only the containers of the server it started."""

from __future__ import annotations

from pathlib import Path

import anyio
import docker
import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import minimal_env, sandbox_container_ids, stdio_client

pytestmark = pytest.mark.anyio

STUCK = "```repl\nimport time\nwhile True:\n    time.sleep(0.1)\n```"
ANSWER = '```repl\nanswer["content"] = context[:5]\nanswer["ready"] = True\n```'


def running(ids: set[str]) -> set[str]:
    """Which of these containers run. The low-level list does not inspect each container, so a
    container another server removes meanwhile cannot fail the call."""
    client = docker.from_env()
    try:
        return {c["Id"] for c in client.api.containers(filters={"status": "running"}) if c["Id"] in ids}
    finally:
        client.close()


async def test_a_neighbour_server_keeps_its_containers_while_another_runs(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=[STUCK])) as stuck_lm, ScriptedLM(Script(root=[ANSWER])) as lm:
        neighbour_env = minimal_env(
            stuck_lm.base_url, tmp_path / "n-data", [tmp_path], RLM_MCP_CELL_TIMEOUT_S="600", RLM_MCP_POOL_SIZE="2"
        )
        neighbour = neighbour_env["RLM_MCP_INSTANCE_ID"]
        async with stdio_client(neighbour_env) as other:
            # The neighbour holds a running run's sandbox and a warm pool.
            ctx = (await other.call_tool("rlm_load_context", {"text": "n"})).structured_content
            started = await other.call_tool("rlm_start", {"query": "q", "context_id": ctx["context_id"]})
            run_id = started.structured_content["run_id"]
            with anyio.fail_after(60):
                while len(running(sandbox_container_ids(neighbour))) < 3:
                    await anyio.sleep(0.2)
            theirs = sandbox_container_ids(neighbour)

            # This server starts (reaping leftovers), runs to completion and shuts down.
            env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
            owner = env["RLM_MCP_INSTANCE_ID"]
            async with stdio_client(env) as client:
                loaded = (await client.call_tool("rlm_load_context", {"text": "hello"})).structured_content
                result = await client.call_tool("rlm_complete", {"query": "q", "context_id": loaded["context_id"]})
                assert result.structured_content["status"] == "completed"
                assert result.structured_content["answer"] == "hello"
                assert sandbox_container_ids(owner), "this server's own sandboxes are counted"
                assert not sandbox_container_ids(owner) & theirs
            assert not sandbox_container_ids(owner)

            # The neighbour's containers all survived, still running, and it still answers.
            assert running(theirs) == theirs
            status = (await other.call_tool("rlm_status", {"run_id": run_id})).structured_content
            assert status["status"] == "running"
            cancelled = (await other.call_tool("rlm_cancel", {"run_id": run_id})).structured_content
            assert cancelled["status"] == "cancelled"
    assert not sandbox_container_ids(neighbour)
