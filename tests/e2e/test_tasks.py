"""MCP Tasks (SEP-2663) for `rlm_complete` (issue 40 item 1), with raw requests from the Python
SDK's client (tests/fixtures_tasks.py): a declared call answers as a task that completes with the
tool's result, or is cancelled by tasks/cancel; a call that does not declare the extension, or
in the handshake era, keeps today's answer; tasks/* without the declaration answer -32021, with a
misrouted Mcp-Name -32020; another token's task and an unknown one answer the same error; docs/long-runs.md's snippets
(handles, tasks) get the answer; two team replicas answer for each other's tasks. Real
Docker sandboxes, the scripted LM, both stores where the answer comes from the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client import advertise
from mcp.shared.exceptions import MCPError
from mcp_types import HEADER_MISMATCH, INVALID_PARAMS, METHOD_NOT_FOUND, MISSING_REQUIRED_CLIENT_CAPABILITY

from rlm_mcp.server.app import build_server
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_http import as_token, serving
from tests.fixtures_surface import ANSWER_NOW, STUCK, call, make_settings
from tests.fixtures_tasks import (
    TASKS,
    MisroutedTaskRequest,
    declaring_tasks,
    send,
    settled,
    task,
    tool_call,
)
from tests.fixtures_team import team_replica
from tests.readme_blocks import blocks

pytestmark = pytest.mark.anyio


async def test_a_declared_complete_is_a_task_that_completes_with_the_tool_result(
    tmp_path: Path, database_url: str | None
) -> None:
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        settings = make_settings(tmp_path, lm.base_url, database_url=database_url, run_max_age_days=2)
        async with Client(build_server(settings), extensions=declaring_tasks()) as client:
            context_id = (await call(client, "rlm_load_context", text="c"))["context_id"]
            created = await tool_call(client, "rlm_complete", query="q", context_id=context_id)
            assert created["resultType"] == "task", created
            assert created["status"] == "working" and created["taskId"].startswith("run_")
            assert created["ttlMs"] == 2 * 86_400_000  # the run record's retention
            assert created["pollIntervalMs"] > 0 and created["createdAt"].endswith("Z")

            done = await settled(client, created["taskId"])
            assert done["status"] == "completed" and done["resultType"] == "complete", done
            result = done["result"]
            assert result["isError"] is False and result["resultType"] == "complete"  # a 2026-07-28 tool result
            assert result["structuredContent"]["answer"] == "forty-two"
            assert result["structuredContent"]["run_id"] == created["taskId"]  # one task per run: its id
            # The run is the same run the handles see.
            assert (await call(client, "rlm_result", run_id=created["taskId"]))["answer"] == "forty-two"
            # Cancelling a task that ended changes nothing, and says so with an empty answer.
            assert (await task(client, "tasks/cancel", created["taskId"]))["resultType"] == "complete"
            assert (await task(client, "tasks/get", created["taskId"]))["status"] == "completed"
            assert (await task(client, "tasks/update", created["taskId"]))["resultType"] == "complete"

            with pytest.raises(MCPError) as unknown:
                await task(client, "tasks/get", "run_00000000000000000000")
            assert unknown.value.error.code == INVALID_PARAMS


async def test_tasks_cancel_cancels_the_run(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=[STUCK])) as lm:
        settings = make_settings(tmp_path, lm.base_url, cell_timeout_s=600)
        owner = settings.sandbox.instance_id
        async with Client(build_server(settings), extensions=declaring_tasks()) as client:
            context_id = (await call(client, "rlm_load_context", text="c"))["context_id"]
            created = await tool_call(client, "rlm_complete", query="q", context_id=context_id)
            task_id = created["taskId"]
            with anyio.fail_after(60):  # its progress is the status message
                while not (await task(client, "tasks/get", task_id))["statusMessage"].startswith("turn 1/"):
                    await anyio.sleep(0.2)
            assert (await task(client, "tasks/cancel", task_id))["resultType"] == "complete"
            ended = await settled(client, task_id)
            assert ended["status"] == "cancelled", ended
            assert "result" not in ended
            assert (await call(client, "rlm_status", run_id=task_id))["status"] == "cancelled"
    assert owner is not None and not sandbox_container_ids(owner)


async def test_without_the_declaration_or_in_the_handshake_era_nothing_changes(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        server = build_server(make_settings(tmp_path, lm.base_url))
        async with Client(server) as plain:
            context_id = (await call(plain, "rlm_load_context", text="c"))["context_id"]
            answered = await tool_call(plain, "rlm_complete", query="q", context_id=context_id)
            assert answered["resultType"] == "complete" and answered["structuredContent"]["answer"] == "forty-two"
            with pytest.raises(MCPError) as undeclared:
                await task(plain, "tasks/get", answered["structuredContent"]["run_id"])
            assert undeclared.value.error.code == MISSING_REQUIRED_CLIENT_CAPABILITY
            assert undeclared.value.error.data == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
        async with Client(server, mode="legacy", extensions=declaring_tasks()) as legacy:
            answered = await tool_call(legacy, "rlm_complete", query="q", context_id=context_id)
            assert answered["structuredContent"]["answer"] == "forty-two"
            with pytest.raises(MCPError) as absent:
                await task(legacy, "tasks/get", answered["structuredContent"]["run_id"])
            assert absent.value.error.code == METHOD_NOT_FOUND
        async with Client(server, extensions=declaring_tasks()) as declared:
            # Refused before a run exists: the tool error at once, not a task.
            refused = await tool_call(declared, "rlm_complete", query="q", context_id="ctx_unknown")
            assert refused["resultType"] == "complete" and refused["isError"] is True
            assert "Unknown context id" in refused["content"][0]["text"]


async def test_another_tokens_task_is_unknown_and_a_misrouted_one_refused(
    tmp_path: Path, database_url: str | None
) -> None:
    """Over HTTP with two tokens (the owner rules and the routing header live there)."""
    with ScriptedLM(Script(root=[STUCK])) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            host="127.0.0.1",
            port=free_port("127.0.0.1"),
            auth_tokens=["alice-token", "bob-token"],
            database_url=database_url,
            cell_timeout_s=600,
        )
        async with (
            serving(settings) as url,
            as_token(url, "alice-token", extensions=declaring_tasks()) as alice,
            as_token(url, "bob-token", extensions=declaring_tasks()) as bob,
        ):
            context_id = (await call(alice, "rlm_load_context", text="c"))["context_id"]
            task_id = (await tool_call(alice, "rlm_complete", query="q", context_id=context_id))["taskId"]
            errors = []
            for probe in (task_id, "run_00000000000000000000"):
                for method in ("tasks/get", "tasks/cancel", "tasks/update"):
                    with pytest.raises(MCPError) as refused:
                        await task(bob, method, probe)
                    errors.append((refused.value.error.code, refused.value.error.message.replace(probe, "ID")))
            assert set(errors) == {
                (INVALID_PARAMS, "Unknown task: ID. Use a taskId returned by a tools/call answered as a task.")
            }
            assert (await task(alice, "tasks/get", task_id))["status"] == "working"  # Bob's cancel did nothing

            misrouted = MisroutedTaskRequest(
                method="tasks/get", params={"taskId": task_id, "routedTo": "run_someone_else"}
            )
            with pytest.raises(MCPError) as mismatch:
                await send(alice, misrouted)
            assert mismatch.value.error.code == HEADER_MISMATCH
            await task(alice, "tasks/cancel", task_id)
            assert (await settled(alice, task_id))["status"] == "cancelled"


def _snippet(name: str) -> dict[str, Any]:
    """The namespace of docs/long-runs.md's snippet marked `<!-- long-runs: NAME -->`."""
    (block,) = [b for b in blocks() if b.marker == f"<!-- long-runs: {name} -->"]
    namespace: dict[str, Any] = {}
    exec(compile(block.text, block.where, "exec"), namespace)
    return namespace


async def test_the_long_runs_page_snippets_get_the_answer(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        server = build_server(make_settings(tmp_path, lm.base_url))
        async with Client(server, extensions=[advertise(_snippet("tasks")["TASKS"])]) as rlm:
            context_id = (await call(rlm, "rlm_load_context", text="c"))["context_id"]
            by_handles = await _snippet("handles")["ask_with_handles"](rlm, "q", context_id)
            assert by_handles["status"] == "completed" and by_handles["answer"] == "forty-two"
            as_a_task = await _snippet("tasks")["ask_as_a_task"](rlm, "q", context_id)
            assert as_a_task["status"] == "completed", as_a_task
            assert as_a_task["result"]["structuredContent"]["answer"] == "forty-two"
            refused = await _snippet("tasks")["ask_as_a_task"](rlm, "q", "ctx_unknown")
            assert refused["isError"] is True


async def test_every_team_replica_answers_for_a_task(tmp_path: Path, pg_url: str) -> None:
    """Two `rlm-mcp serve` processes on one PostgreSQL database: a task accepted by one is read,
    refused to another token, and cancelled through the other; a finished one reads the same."""
    script = Script(
        root_by_query=[RootScript(match="STUCK-Q", replies=[STUCK]), RootScript(match="OK-Q", replies=[ANSWER_NOW])]
    )
    alice, bob = "alice-task-token", "bob-task-token"
    with (
        ScriptedLM(script) as lm,
        team_replica(tmp_path / "a", role="both", database_url=pg_url, lm_url=lm.base_url, tokens=[alice, bob]) as a,
        team_replica(tmp_path / "b", role="front", database_url=pg_url, lm_url=lm.base_url, tokens=[alice, bob]) as b,
    ):
        declared = declaring_tasks()
        async with (
            as_token(f"{a.base}/mcp", alice, extensions=declared) as on_a,
            as_token(f"{b.base}/mcp", alice, extensions=declared) as on_b,
            as_token(f"{b.base}/mcp", bob, extensions=declared) as bob_on_b,
        ):
            context_id = (await call(on_a, "rlm_load_context", text="c"))["context_id"]
            done = await tool_call(on_b, "rlm_complete", query="OK-Q", context_id=context_id)  # accepted by B
            finished = await settled(on_a, done["taskId"])  # read on A
            assert finished["result"]["structuredContent"]["answer"] == "forty-two"
            assert await task(on_b, "tasks/get", done["taskId"]) == finished  # the same task from either

            stuck = (await tool_call(on_a, "rlm_complete", query="STUCK-Q", context_id=context_id))["taskId"]
            with anyio.fail_after(120):
                while not (await task(on_b, "tasks/get", stuck))["statusMessage"].startswith("turn 1/"):
                    await anyio.sleep(0.5)
            with pytest.raises(MCPError) as foreign:
                await task(bob_on_b, "tasks/get", stuck)
            assert foreign.value.error.code == INVALID_PARAMS
            await task(on_b, "tasks/cancel", stuck)  # B cancels the run A accepted
            assert (await settled(on_a, stuck))["status"] == "cancelled"
