"""Kept sessions through the MCP surface, with a real Docker sandbox and the scripted LM: a
variable set in run 1 is read in run 2; `context_1` and `history` are there; one sandbox serves
the whole session; another owner cannot see or continue it; a closed or idle session says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import anyio
import docker
import pytest
from mcp import Client

from rlm_mcp.assembly import build_service
from rlm_mcp.owners import Owner
from rlm_mcp.server.app import build_server
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.service.sessions import SessionManager
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from rlm_mcp.viewer.model import build_run, index_entry
from tests.fixtures_e2e import cli, sandbox_container_ids
from tests.fixtures_engine import cell, submit
from tests.fixtures_surface import SCRIPT, call, call_error, make_settings, resource_text

pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.usefixtures("docker_image")]


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


async def test_a_follow_up_reads_the_first_runs_variables_in_the_same_sandbox(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0)
        async with Client(build_server(settings)) as client:
            first_ctx = await call(client, "rlm_load_context", text="alpha beta alpha gamma")
            second_ctx = await call(client, "rlm_load_context", text="second context body")
            one = await call(
                client, "rlm_complete", query="FIRST-Q", context_id=first_ctx["context_id"], keep_session=True
            )
            assert one["status"] == "completed" and one["answer"] == "built"
            session_id = one["session_id"]
            assert session_id.startswith("ses_")
            instance = settings.sandbox.instance_id
            assert instance is not None
            live = sandbox_container_ids(instance)
            assert len(live) == 1  # the session's REPL outlived its run

            two = await call(
                client,
                "rlm_complete",
                query="SECOND-Q",
                context_id=second_ctx["context_id"],
                session_id=session_id,
            )
            assert two["status"] == "completed"
            assert two["answer"] == "2|second|6|True"
            assert two["session_id"] == session_id
            assert sandbox_container_ids(instance) == live  # the same sandbox served it

            listed = (await call(client, "rlm_list_sessions"))["sessions"]
            assert [s["session_id"] for s in listed] == [session_id]
            assert listed[0]["runs"] == [one["run_id"], two["run_id"]]
            assert listed[0]["contexts_bound"] == 2 and listed[0]["histories"] == 2
            assert listed[0]["usage"]["total"]["calls"] == 4  # two runs of two root calls each
            resource = json.loads(resource_text(await client.read_resource(f"rlm://sessions/{session_id}")))
            assert resource["context_ids"] == [first_ctx["context_id"], second_ctx["context_id"]]
            record = json.loads(resource_text(await client.read_resource(f"rlm://runs/{two['run_id']}")))
            assert record["session_id"] == session_id

            closed = await call(client, "rlm_close_session", session_id=session_id)
            assert closed["runs"] == [one["run_id"], two["run_id"]]
            await wait_until(lambda: not sandbox_container_ids(instance), within_s=60, what="the sandbox released")
            error = await call_error(client, "rlm_complete", query="SECOND-Q", session_id=session_id)
            assert f"Session {session_id} was closed" in error and "keep_session=true" in error


async def test_a_session_is_its_owners_alone_and_idles_out(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        # Snapshots off: the session ends when its sandbox goes (tests/docker/test_sessions_snapshot.py
        # covers the session kept as a snapshot, which the sandbox image's dill makes the default).
        settings = make_settings(tmp_path, lm.base_url, pool_size=0, session_idle_s=3600, session_snapshot_max_bytes=0)
        alice, bob = Owner("alice"), Owner("bob")
        instance = settings.sandbox.instance_id
        assert instance is not None
        async with build_service(settings) as service:
            as_alice, as_bob = Caller(service, alice), Caller(service, bob)
            info = await as_alice.load_context(text="alpha beta")
            result, session_id = await as_alice.complete_in_session(
                "FIRST-Q", info.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert result.status == "completed" and session_id is not None
            with pytest.raises(Exception, match=f"Unknown session id '{session_id}'"):
                await as_bob.start_run("SECOND-Q", None, RunOverrides(), session_id=session_id)
            assert await as_bob.list_sessions() == []
            with pytest.raises(Exception, match="Unknown session id"):
                await as_bob.close_session(session_id)

            # Idle past RLM_MCP_SESSION_IDLE_S: the sweep ends it and releases its sandbox.
            embedded = cast(SessionManager, service.sessions)  # the embedded backend's own sweep
            embedded._settings = settings.model_copy(update={"session_idle_s": 0.001}).kept_sessions
            await embedded.sweep()
            await wait_until(lambda: not sandbox_container_ids(instance), within_s=60, what="the sandbox released")
            with pytest.raises(Exception, match="ended after RLM_MCP_SESSION_IDLE_S") as caught:
                await as_alice.start_run("SECOND-Q", None, RunOverrides(), session_id=session_id)
            assert "keep_session=true" in str(caught.value) and "snapshots are off" in str(caught.value)


async def test_an_idle_session_yields_its_sandbox_slot_to_a_run(tmp_path: Path) -> None:
    plain = Script(root=[submit('"plain"')], root_by_query=SCRIPT.root_by_query)
    with ScriptedLM(plain) as lm:
        settings = make_settings(
            tmp_path, lm.base_url, pool_size=0, max_sandboxes=1, run_queue_timeout_s=20, session_snapshot_max_bytes=0
        )  # snapshots off: the evicted session ends (kept as a snapshot: tests/docker/test_sessions_snapshot.py)
        async with build_service(settings) as service:
            local = Caller(service, Owner("local"))
            info = await local.load_context(text="alpha beta")
            _, session_id = await local.complete_in_session(
                "FIRST-Q", info.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert session_id is not None
            assert service.sandboxes.free_slots == 0  # the idle session holds the only slot
            # A run without a session needs that slot: the idle session gives it back.
            other = await local.complete("OTHER-Q", info.context_id, RunOverrides(), _quiet)
            assert other.status == "completed" and other.answer == "plain"
            with pytest.raises(Exception, match="was ended while idle to free its sandbox") as caught:
                await local.start_run("SECOND-Q", None, RunOverrides(), session_id=session_id)
            assert "keep_session=true" in str(caught.value) and "snapshots are off" in str(caught.value)


async def test_chat_export_of_a_session_keeps_its_run_order(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=[submit('"plain"')], root_by_query=SCRIPT.root_by_query)) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0)
        async with build_service(settings) as service:
            local = Caller(service, Owner("local"))
            first = await local.load_context(text="alpha beta alpha")
            second = await local.load_context(text="second context")
            _, sid = await local.complete_in_session(
                "FIRST-Q", first.context_id, RunOverrides(), _quiet, keep_session=True
            )
            await local.complete("OTHER-Q", first.context_id, RunOverrides(), _quiet)
            two, _ = await local.complete_in_session(
                "SECOND-Q", second.context_id, RunOverrides(), _quiet, session_id=sid
            )
            # The viewer's models name the session (the index numbers its runs into a chain).
            record = await local.run_record(two.run_id)
            assert build_run(record, await local.run_events(two.run_id))["session_id"] == sid
            assert index_entry(record)["session_id"] == sid
    assert sid is not None
    proc = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "runs", "export", sid, "--format", "chat"))
    assert proc.returncode == 0, proc.stderr
    conversations = [json.loads(line)["messages"] for line in proc.stdout.splitlines()]
    assert len(conversations) == 2  # the session's two runs, not the run outside it
    assert "FIRST-Q" in conversations[0][1]["content"] and "SECOND-Q" in conversations[1][1]["content"]


async def test_team_mode_keeps_sessions_in_the_database(tmp_path: Path, pg_migrated_url: str) -> None:
    # One process in team mode (front and worker): the session is a row of the database
    # (tests/e2e/test_team_sessions.py takes one across replicas and a killed worker).
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0, database_url=pg_migrated_url)
        async with Client(build_server(settings)) as client:
            first_ctx = await call(client, "rlm_load_context", text="alpha beta alpha gamma")
            second_ctx = await call(client, "rlm_load_context", text="second context body")
            one = await call(
                client, "rlm_complete", query="FIRST-Q", context_id=first_ctx["context_id"], keep_session=True
            )
            assert one["status"] == "completed" and one["session_id"].startswith("ses_")
            two = await call(
                client,
                "rlm_complete",
                query="SECOND-Q",
                context_id=second_ctx["context_id"],
                session_id=one["session_id"],
            )
            assert two["answer"] == "2|second|6|True" and two["session_id"] == one["session_id"]
            shown = json.loads(resource_text(await client.read_resource(f"rlm://sessions/{one['session_id']}")))
            assert shown["runs"] == [one["run_id"], two["run_id"]] and shown["histories"] == 2
            assert shown["usage"]["total"]["calls"] == 4
            error = await call_error(client, "rlm_complete", query="FIRST-Q", session_id="ses_0123456789abcdef0123")
            assert "Unknown session id 'ses_0123456789abcdef0123'" in error


async def test_a_session_whose_sandbox_died_between_runs_goes_on_and_says_so(tmp_path: Path) -> None:
    names = "print(sorted(k for k in globals() if k.startswith(('counts', 'history', 'context'))))"
    script = Script(
        root_by_query=[
            SCRIPT.root_by_query[0],
            RootScript(match="AFTER-Q", replies=[cell(names), submit("str(len(history_0))")]),
        ]
    )
    with ScriptedLM(script) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0)
        async with build_service(settings) as service:
            local = Caller(service, Owner("local"))
            first = await local.load_context(text="alpha beta alpha")
            second = await local.load_context(text="second context")
            _, sid = await local.complete_in_session(
                "FIRST-Q", first.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
            channel = getattr(
                cast(SessionManager, service.sessions).get(sid, owner=Owner("local")).repl.sandbox, "container", None
            )
            assert channel is not None
            client = docker.from_env()
            try:
                await anyio.to_thread.run_sync(lambda: client.api.kill(channel.name))
            finally:
                client.close()
            result, _ = await local.complete_in_session(
                "AFTER-Q", second.context_id, RunOverrides(), _quiet, session_id=sid
            )
        assert result.status == "completed" and result.answer == "6"  # the history was bound again
        last = lm.requests_by_role("root")[-1]["body"]["messages"]
        output = last[4]["content"]  # the run's first REPL output
        assert "had stopped since the last question and was started again" in output
        # `counts` went with the sandbox; the contexts and the history are back.
        assert "['context', 'context_0', 'context_1', 'history', 'history_0']" in output
