"""End to end over stdio: hostile cells inside one run, contexts from a folder and a loopback
URL, cancellation by the client, and cleanup when the server's stdin closes or it gets SIGTERM."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import close_pipes
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, minimal_env, sandbox_container_ids, sandbox_states, stdio_client
from tests.fixtures_store import LoopbackServer

FAST_CELLS = {"RLM_MCP_CELL_TIMEOUT_S": "3", "RLM_MCP_SANDBOX_MEMORY": "256m", "RLM_MCP_SANDBOX_PIDS": "64"}


def cell(code: str) -> str:
    return f"```repl\n{code}\n```"


HOSTILE_TURNS = [
    cell("import os\nos._exit(3)"),
    cell("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    cell("blob = []\nwhile True:\n    blob.append(bytearray(50 * 1024 * 1024))"),
    cell("sum(range(10**13))"),
    cell("import sys\nsys.stdout.write('x' * 30_000_000)\nprint(llm_query('still alive?'))"),
    cell('answer["content"] = "survived " + context[:5]\nanswer["ready"] = True'),
]


@pytest.mark.anyio
async def test_hostile_cells_cannot_stop_a_run(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=HOSTILE_TURNS, sub_default="yes")) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path], **FAST_CELLS)
        owner = env["RLM_MCP_INSTANCE_ID"]
        async with stdio_client(env) as client:
            ctx = (await client.call_tool("rlm_load_context", {"text": "hello world"})).structured_content
            result = await client.call_tool("rlm_complete", {"query": "survive", "context_id": ctx["context_id"]})
            out = result.structured_content
            assert out["status"] == "completed", out
            assert out["answer"] == "survived hello"
            assert out["iterations"] == len(HOSTILE_TURNS)
            # The server still answers after all that.
            listed = await client.call_tool("rlm_list_contexts", {})
            assert len(listed.structured_content["contexts"]) == 1
        outputs = [r["body"]["messages"][-2]["content"] for r in lm.requests_by_role("root")[1:]]
    # The model was told plainly what happened to each hostile cell.
    assert "variables were lost" in outputs[0]
    assert "[" in outputs[4] and "chars..." in outputs[4]  # 30 MB of output, cut for the model
    assert not sandbox_container_ids(owner)


@pytest.fixture
def loopback_url(http_server: LoopbackServer) -> str:
    http_server.route(
        "/notes.txt", b"served over loopback: the answer is 17\n", Content_Type="text/plain; charset=utf-8"
    )
    return http_server.url("/notes.txt")


@pytest.mark.anyio
async def test_contexts_from_a_folder_and_a_loopback_url(tmp_path: Path, loopback_url: str) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('main')\n")
    (project / "README.md").write_text("# readme\n")
    (project / ".secret").write_text("hidden\n")
    (project / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    code = cell(
        'answer["content"] = str(len(context_0)) + "/" + context_1.split(": ")[1].strip()\nanswer["ready"] = True'
    )
    with ScriptedLM(Script(root=[code])) as lm:
        async with stdio_client(minimal_env(lm.base_url, tmp_path / "data", [tmp_path])) as client:
            folder = (await client.call_tool("rlm_load_context", {"path": str(project)})).structured_content
            assert folder["source"]["type"] == "folder"
            text = (await client.call_tool("rlm_load_context", {"url": loopback_url})).structured_content
            assert text["bytes"] == len(b"served over loopback: the answer is 17\n")
            result = await client.call_tool(
                "rlm_complete", {"query": "q", "context_id": [folder["context_id"], text["context_id"]]}
            )
            out = result.structured_content
    assert out["status"] == "completed", out
    assert out["answer"] == f"{folder['chars']}/the answer is 17"
    # Two text files taken; the hidden file and the binary one skipped and counted.
    assert folder["source"]["files"] == 2
    assert sum(folder["source"]["skipped"].values()) == 2


@pytest.mark.anyio
async def test_a_client_cancel_stops_the_run_and_records_it(tmp_path: Path, database_url: str | None) -> None:
    # Over both stores: in team mode the run executes on the server's own worker and the cancel
    # reaches it through the queue.
    stuck = cell("import time\nwhile True:\n    time.sleep(0.1)")
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    with ScriptedLM(Script(root=[stuck])) as lm:
        team = {"RLM_MCP_DATABASE_URL": database_url} if database_url is not None else {}
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path], RLM_MCP_CELL_TIMEOUT_S="600", **team)
        owner = env["RLM_MCP_INSTANCE_ID"]
        async with stdio_client(env) as client:
            ctx = (await client.call_tool("rlm_load_context", {"text": "c"})).structured_content

            async def complete() -> None:
                await client.call_tool(
                    "rlm_complete", {"query": "q", "context_id": ctx["context_id"]}, progress_callback=on_progress
                )
                raise AssertionError("a stuck run returned")

            async def run_id_if_running() -> str | None:
                said = [m.split()[1] for m in messages if m.startswith("run ")]
                if not said:
                    return None
                status = (await client.call_tool("rlm_status", {"run_id": said[0]})).structured_content
                return said[0] if status["status"] == "running" else None

            # The client gives up on the call mid-run: once the run has said its id and is running.
            async with anyio.create_task_group() as tg:
                tg.start_soon(complete)
                await wait_until(run_id_if_running, within_s=120, what="the run running")
                tg.cancel_scope.cancel()
            run_id = next(m.split()[1] for m in messages if m.startswith("run "))
            with anyio.fail_after(60):  # generous: in team mode the cancel travels through the queue
                while True:
                    status = (await client.call_tool("rlm_status", {"run_id": run_id})).structured_content
                    if status["status"] == "cancelled":
                        break
                    await anyio.sleep(0.2)
            # The run's sandbox went with it; at most the warm pool's one fresh container is left.
            # The used container is removed in the background.
            await wait_until(
                lambda: len(sandbox_container_ids(owner)) <= 1,
                within_s=60,
                what="the cancelled run's sandbox removed",
                found=functools.partial(sandbox_states, owner),
                poll_s=0.2,  # each poll is a Docker listing, which blocks this loop
            )
    assert not sandbox_container_ids(owner)


def _rpc(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()


def _read_until(proc: subprocess.Popen[bytes], request_id: int) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, "the server closed stdout"
        message = json.loads(line)  # anything but JSON-RPC on stdout would fail here
        if message.get("id") == request_id:
            return message


@pytest.mark.parametrize("stop", ["sigterm", "stdin_closed"])
def test_server_exit_mid_run_removes_its_sandboxes(tmp_path: Path, stop: str) -> None:
    stuck = cell("import time\nwhile True:\n    time.sleep(0.1)")
    with ScriptedLM(Script(root=[stuck])) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path], RLM_MCP_CELL_TIMEOUT_S="600")
        owner = env["RLM_MCP_INSTANCE_ID"]
        proc = subprocess.Popen([str(SERVER_SCRIPT)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            _rpc(
                proc,
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "0"},
                    },
                },
            )
            assert "result" in _read_until(proc, 1)
            _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            _rpc(
                proc,
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "rlm_load_context", "arguments": {"text": "c"}},
                },
            )
            context_id = _read_until(proc, 2)["result"]["structuredContent"]["context_id"]
            _rpc(
                proc,
                {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "tools/call",
                    "params": {"name": "rlm_start", "arguments": {"query": "q", "context_id": context_id}},
                },
            )
            assert _read_until(proc, 3)["result"]["structuredContent"]["status"] == "running"
            # Mid-run: the model has written the stuck cell and the run holds a sandbox.
            anyio.run(
                functools.partial(
                    wait_until,
                    lambda: lm.requests_by_role("root") and sandbox_container_ids(owner),
                    what="the run's cell",
                )
            )
            if stop == "sigterm":
                proc.send_signal(signal.SIGTERM)
            else:
                assert proc.stdin is not None
                proc.stdin.close()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            close_pipes(proc)
    assert not sandbox_container_ids(owner)


@pytest.mark.anyio
async def test_run_timeout_interrupts_a_stuck_cell_and_keeps_the_partial_answer(tmp_path: Path) -> None:
    turns = [
        cell('answer["content"] = "partial"'),
        cell("while True:\n    pass"),
    ]
    with ScriptedLM(Script(root=turns)) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path], RLM_MCP_CELL_TIMEOUT_S="600")
        owner = env["RLM_MCP_INSTANCE_ID"]
        async with stdio_client(env) as client:
            ctx = (await client.call_tool("rlm_load_context", {"text": "c"})).structured_content
            with anyio.fail_after(300):  # the 600 s cell limit must not be what ends it
                result = await client.call_tool(
                    "rlm_complete", {"query": "q", "context_id": ctx["context_id"], "timeout_s": 15}
                )
            out = result.structured_content
            assert out["status"] == "timeout", out
            assert out["answer"] == "partial"
            assert "timeout_s=15" in out["reason"]  # the run's limit decided it (its first cell has 15 s to begin)
    assert not sandbox_container_ids(owner)


ANSWER_VARIANTS = {
    "update": cell('answer.update({"content": "via update", "ready": True})'),
    "rebind": cell('answer = {"content": 12345, "ready": True}'),
    "ready_first": cell('answer["ready"] = True\nanswer["content"] = "order does not matter"'),
    "final_var": "I computed it.\n" + cell('result = "from a variable"') + "\nFINAL_VAR(result)",
    "final_text": "The answer is plain.\nFINAL(in the text)",
}
EXPECTED = {
    "update": "via update",
    "rebind": "12345",
    "ready_first": "order does not matter",
    "final_var": "from a variable",
    "final_text": "in the text",
}


@pytest.mark.anyio
async def test_answer_protocol_variants_through_the_real_kernel(tmp_path: Path) -> None:
    script = Script(
        root_by_query=[{"match": f"variant {name}\n", "replies": [reply]} for name, reply in ANSWER_VARIANTS.items()]
    )
    with ScriptedLM(script) as lm:
        async with stdio_client(minimal_env(lm.base_url, tmp_path / "data", [tmp_path])) as client:
            ctx = (await client.call_tool("rlm_load_context", {"text": "c"})).structured_content
            for name in ANSWER_VARIANTS:
                result = await client.call_tool(
                    "rlm_complete", {"query": f"variant {name}", "context_id": ctx["context_id"]}
                )
                out = result.structured_content
                assert out["status"] == "completed", (name, out)
                assert out["answer"] == EXPECTED[name], name
