"""The MCP surface through the SDK's in-process client: every tool, resource and error
channel (README, "Tools and resources"), with a real Docker sandbox and the scripted LM on loopback.
The tests whose answers come from the store (contexts, uploads, run records and their resources)
run against both stores (`database_url`: SQLite and files, then PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.server.app import build_server
from rlm_mcp.service.caller import Caller
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_surface import ALL_TOOLS, ANSWER_NOW, PARENT, STUCK, call, call_error, make_settings, resource_text

pytestmark = pytest.mark.anyio

FIRST_RELEASE_RUN_KEYS = frozenset(
    {"run_id", "query", "context_ids", "owner", "limits", "created_at", "model", "status", "iterations"}
    | {"max_iterations", "sub_calls", "usage", "elapsed_s", "result"}
)


async def test_tools_are_declared_with_honest_annotations(tmp_path: Path) -> None:
    async with Client(build_server(make_settings(tmp_path, "http://127.0.0.1:9/v1"))) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) >= ALL_TOOLS
    annotations = {name: tool.annotations for name, tool in tools.items()}
    assert all(a is not None for a in annotations.values()), annotations
    assert getattr(annotations["rlm_delete_context"], "destructive_hint", None) is True
    assert getattr(annotations["rlm_list_contexts"], "read_only_hint", None) is True
    assert getattr(annotations["rlm_complete"], "open_world_hint", None) is True
    assert tools["rlm_complete"].output_schema is not None
    assert "status" in tools["rlm_complete"].output_schema["properties"]


async def test_contexts_round_trip_and_unknown_ids(tmp_path: Path, database_url: str | None) -> None:
    # No Docker and no LM are needed to manage contexts: both are reached lazily.
    settings = make_settings(tmp_path, "http://127.0.0.1:9/v1", database_url=database_url)
    async with Client(build_server(settings)) as client:
        first = await call(client, "rlm_load_context", text="hello world", name="greeting")
        second = await call(client, "rlm_load_context", text="hello world")
        assert first["context_id"] == second["context_id"]
        assert first["bytes"] == 11 and first["chars"] == 11 and first["kind"] == "str"
        as_json = await call(client, "rlm_load_context", text='{"a": [1, 2]}', format="json")
        assert as_json["kind"] == "dict"

        listed = await call(client, "rlm_list_contexts")
        assert {c["context_id"] for c in listed["contexts"]} == {first["context_id"], as_json["context_id"]}

        resource = await client.read_resource(f"rlm://contexts/{first['context_id']}")
        assert json.loads(resource_text(resource))["sha256"] == first["sha256"]

        deleted = await call(client, "rlm_delete_context", context_id=first["context_id"])
        assert deleted["deleted"] is True
        message = await call_error(client, "rlm_delete_context", context_id=first["context_id"])
        assert "Unknown context id" in message and "rlm_list_contexts" in message

        message = await call_error(client, "rlm_complete", query="q", context_id="ctx_missing")
        assert "Unknown context id" in message

        message = await call_error(client, "rlm_load_context", text="a", path="/etc/passwd")
        assert "exactly one" in message

        message = await call_error(client, "rlm_load_context", path="/etc/passwd")
        assert "RLM_MCP_ALLOWED_ROOTS" in message

        message = await call_error(client, "rlm_status", run_id="run_doesnotexist")
        assert "Unknown run id" in message


async def test_chunked_upload_issues_an_id_and_checks_sha(tmp_path: Path, database_url: str | None) -> None:
    import hashlib

    payload = "line of text\n" * 1000
    half = len(payload) // 2
    digest = hashlib.sha256(payload.encode()).hexdigest()
    settings = make_settings(tmp_path, "http://127.0.0.1:9/v1", database_url=database_url)
    async with Client(build_server(settings)) as client:
        first = await call(client, "rlm_upload_context", data=payload[:half], index=0)
        assert first["upload_id"] and first["next_index"] == 1 and not first["done"]
        done = await call(
            client,
            "rlm_upload_context",
            data=payload[half:],
            index=1,
            upload_id=first["upload_id"],
            final=True,
            sha256=digest,
            name="uploaded",
        )
        assert done["done"] is True
        assert done["context"]["sha256"] == digest
        loaded = await call(client, "rlm_load_context", text=payload)
        assert loaded["context_id"] == done["context"]["context_id"]


async def test_complete_answers_and_reports_structured_usage(tmp_path: Path, database_url: str | None) -> None:
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        settings = make_settings(tmp_path, lm.base_url, database_url=database_url)
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="QZX-body-of-the-context-77")
            out = await call(client, "rlm_complete", query="What?", context_id=ctx["context_id"])
            assert out["status"] == "completed"
            assert out["answer"] == "forty-two"
            assert out["usage"]["total"]["calls"] == 1
            assert out["usage"]["by_model"]["rlm-v0.1"]["calls"] == 1

            summary = json.loads(resource_text(await client.read_resource(f"rlm://runs/{out['run_id']}")))
            assert summary["status"] == "completed"
            # The keys the first release served, with the same meaning (RunRecord.to_stored).
            assert set(FIRST_RELEASE_RUN_KEYS) <= summary.keys(), FIRST_RELEASE_RUN_KEYS - summary.keys()
            assert summary["result"]["answer"] == "forty-two" and summary["usage"] == out["usage"]
            trajectory = resource_text(await client.read_resource(f"rlm://runs/{out['run_id']}/trajectory"))
            types = [json.loads(line)["type"] for line in trajectory.splitlines()]
            assert types[0] == "run_start" and "cell" in types and types[-1] == "run_end"
            assert "QZX-body" not in trajectory  # the log never holds the context body


async def test_long_answers_are_capped_and_served_whole_as_a_resource(tmp_path: Path, database_url: str | None) -> None:
    big = '```repl\nanswer["content"] = "x" * 5000\nanswer["ready"] = True\n```'
    with ScriptedLM(Script(root=[big])) as lm:
        settings = make_settings(tmp_path, lm.base_url, answer_max_chars=100, database_url=database_url)
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="c")
            out = await call(client, "rlm_complete", query="q", context_id=ctx["context_id"])
            assert out["answer_truncated"] is True and out["answer_chars"] == 5000
            assert len(out["answer"]) < 300
            whole = await client.read_resource(out["answer_resource"])
            assert resource_text(whole) == "x" * 5000


async def test_start_poll_and_cancel_a_stuck_run(tmp_path: Path, database_url: str | None) -> None:
    with ScriptedLM(Script(root=[STUCK])) as lm:
        settings = make_settings(tmp_path, lm.base_url, cell_timeout_s=600, database_url=database_url)
        owner = settings.sandbox.instance_id
        assert owner is not None
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="c")
            started = await call(client, "rlm_start", query="q", context_id=ctx["context_id"])
            run_id = started["run_id"]
            with anyio.fail_after(60):
                while (await call(client, "rlm_status", run_id=run_id))["iterations"] < 1:
                    await anyio.sleep(0.2)
            status = await call(client, "rlm_status", run_id=run_id)
            assert status["status"] == "running"
            running = await call(client, "rlm_result", run_id=run_id, wait_s=0.5)
            assert running["status"] == "running"

            cancelled = await call(client, "rlm_cancel", run_id=run_id)
            # rlm_cancel waits a few seconds for the stop; on a loaded machine (or through team
            # mode's queue) it may answer before, still `running`, and the stop follows.
            assert cancelled["status"] in ("cancelled", "running"), cancelled
            result = await call(client, "rlm_result", run_id=run_id, wait_s=60)
            assert result["status"] == "cancelled"
            summary = json.loads(resource_text(await client.read_resource(f"rlm://runs/{run_id}")))
            assert summary["status"] == "cancelled"
    assert not sandbox_container_ids(owner)


async def test_errors_before_the_run_are_tool_errors_naming_the_fix(tmp_path: Path) -> None:
    # LM endpoint down: nothing listens on port 9.
    async with Client(build_server(make_settings(tmp_path, "http://127.0.0.1:9/v1"))) as client:
        ctx = await call(client, "rlm_load_context", text="c")
        message = await call_error(client, "rlm_complete", query="q", context_id=ctx["context_id"])
        assert "127.0.0.1:9" in message and "RLM_MCP_BASE_URL" in message

        message = await call_error(client, "rlm_complete", query="  ", context_id=ctx["context_id"])
        assert "query" in message

    # The configured model is not served.
    with ScriptedLM(Script(model="some-other-model")) as lm:
        async with Client(build_server(make_settings(tmp_path, lm.base_url))) as client:
            ctx = await call(client, "rlm_load_context", text="c")
            message = await call_error(client, "rlm_complete", query="q", context_id=ctx["context_id"])
            assert "rlm-v0.1" in message and "RLM_MCP_MODEL" in message

    # The sandbox image is missing.
    settings = make_settings(tmp_path, "http://127.0.0.1:9/v1", sandbox_image="rlm-mcp-sandbox:does-not-exist")
    async with Client(build_server(settings)) as client:
        ctx = await call(client, "rlm_load_context", text="c")
        message = await call_error(client, "rlm_complete", query="q", context_id=ctx["context_id"])
        assert "rlm-mcp image build" in message


async def test_docker_not_running_is_a_tool_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-docker.sock'}")
    async with Client(build_server(make_settings(tmp_path, "http://127.0.0.1:9/v1"))) as client:
        ctx = await call(client, "rlm_load_context", text="c")
        message = await call_error(client, "rlm_complete", query="q", context_id=ctx["context_id"])
        assert "Docker" in message and "not running" in message


async def test_too_many_runs_is_refused_clearly(tmp_path: Path, database_url: str | None) -> None:
    # Team mode queues a run for any replica's worker: one that no worker takes within
    # RLM_MCP_RUN_QUEUE_TIMEOUT_S ends `error` (its record says why) instead of a refusal. Its
    # wait is longer there, so a loaded machine's slow claim of the first run is not it.
    queue_timeout_s = 1 if database_url is None else 5
    with ScriptedLM(Script(root=[STUCK])) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            max_runs=1,
            run_queue_timeout_s=queue_timeout_s,
            cell_timeout_s=600,
            database_url=database_url,
        )
        async with Client(build_server(settings)) as client:
            ctx = await call(client, "rlm_load_context", text="c")
            first = await call(client, "rlm_start", query="q", context_id=ctx["context_id"])

            async def first_running() -> bool:
                return (await call(client, "rlm_status", run_id=first["run_id"]))["status"] == "running"

            await wait_until(first_running, within_s=120, what="the first run taking the one slot")
            if database_url is None:
                message = await call_error(client, "rlm_complete", query="q2", context_id=ctx["context_id"])
                assert "RLM_MCP_MAX_RUNS" in message
            else:
                out = await call(client, "rlm_complete", query="q2", context_id=ctx["context_id"])
                assert out["status"] == "error", out
                assert "RLM_MCP_RUN_QUEUE_TIMEOUT_S" in out["reason"] and "RLM_MCP_MAX_RUNS" in out["reason"]
                status = await call(client, "rlm_status", run_id=out["run_id"])
                assert status["status"] == "error"
                assert status["reason"] == out["reason"]  # a finished run's status says why it ended
            await call(client, "rlm_cancel", run_id=first["run_id"])
            ended = await call(client, "rlm_result", run_id=first["run_id"], wait_s=60)
            status = await call(client, "rlm_status", run_id=first["run_id"])
            assert status["status"] == ended["status"] == "cancelled"
            assert status["reason"] and status["reason"] == ended["reason"]


CHILD = """```repl
import re
code = re.search(r"launch code is (\\S+?)\\.", context).group(1)
answer["content"] = code
answer["ready"] = True
```"""


async def test_depth_two_runs_a_child_rlm_whose_usage_counts(tmp_path: Path, database_url: str | None) -> None:
    script = Script(root_by_query=[{"match": "Answer the following: parent", "replies": [PARENT]}], root=[CHILD])
    with ScriptedLM(script) as lm:
        async with Client(build_server(make_settings(tmp_path, lm.base_url, database_url=database_url))) as client:
            ctx = await call(client, "rlm_load_context", text="irrelevant")
            out = await call(client, "rlm_complete", query="parent question", context_id=ctx["context_id"], max_depth=2)
            assert out["status"] == "completed", out
            assert out["answer"] == "child said: OWL-9"
            # Two root calls (parent and child), no plain sub-call.
            assert out["usage"]["total"]["calls"] == 2
            shallow = await call(client, "rlm_complete", query="parent question", context_id=ctx["context_id"])
            # At the default depth 1, rlm_query is a plain sub-call: the sub default answers.
            assert shallow["answer"] == "child said: ok"
        roots = lm.requests_by_role("root")
    assert len(roots) == 3  # parent, child, then the depth-1 parent
    # The child's root model saw metadata about its context (the prompt), never the prompt itself.
    assert all("OWL-9" not in str(r["body"]["messages"][1]["content"]) for r in roots)


async def test_old_finished_runs_are_served_from_their_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str | None
) -> None:
    import rlm_mcp.service.queue.front as front_module
    import rlm_mcp.service.runs as runs_module

    monkeypatch.setattr(runs_module, "FINISHED_RUNS_KEPT", 1)
    monkeypatch.setattr(front_module, "FINISHED_RUNS_KEPT", 1)  # team mode's runs are followed there
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        mcp = build_server(make_settings(tmp_path, lm.base_url, database_url=database_url))
        async with Client(mcp) as client:
            ctx = await call(client, "rlm_load_context", text="c")
            first = await call(client, "rlm_complete", query="one", context_id=ctx["context_id"])
            await call(client, "rlm_complete", query="two", context_id=ctx["context_id"])
            await call(client, "rlm_complete", query="three", context_id=ctx["context_id"])
            # The first run left memory, but every tool still answers for it from its record.
            assert (await call(client, "rlm_status", run_id=first["run_id"]))["status"] == "completed"
            result = await call(client, "rlm_result", run_id=first["run_id"])
            assert result["answer"] == "forty-two" and result["status"] == "completed"
            assert (await call(client, "rlm_cancel", run_id=first["run_id"]))["status"] == "completed"
            answer = await client.read_resource(f"rlm://runs/{first['run_id']}/answer")
            assert resource_text(answer) == "forty-two"


async def test_finished_runs_beyond_the_cap_leave_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str | None
) -> None:
    import rlm_mcp.service.queue.front as front_module
    import rlm_mcp.service.runs as runs_module
    from rlm_mcp.assembly import build_service
    from rlm_mcp.service.limits import RunOverrides

    async def quiet(progress: float, total: float | None, message: str) -> None:
        return None

    monkeypatch.setattr(runs_module, "FINISHED_RUNS_KEPT", 1)
    monkeypatch.setattr(front_module, "FINISHED_RUNS_KEPT", 1)  # team mode's runs are followed there
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        async with build_service(make_settings(tmp_path, lm.base_url, database_url=database_url)) as service:
            local = Caller(service, LOCAL_OWNER)
            ctx = await local.load_context(text="c")
            first = await local.complete("one", ctx.context_id, RunOverrides(), quiet)
            second = await local.complete("two", ctx.context_id, RunOverrides(), quiet)
            assert service.runs.get(first.run_id, owner=LOCAL_OWNER) is None
            assert service.runs.get(second.run_id, owner=LOCAL_OWNER) is not None
            assert (await local.status(first.run_id)).status == "completed"
