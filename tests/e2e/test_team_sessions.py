"""Team-mode kept sessions end to end: two `rlm-mcp serve --role both` processes on one PostgreSQL
database, real Docker, the scripted LM. A variable set in run 1 (through replica A) is read in
run 2 through replica B, on the worker that holds the live sandbox (the claim preference); two
follow-ups sent at once through both replicas: exactly one runs, the other is told to wait for it;
the holding worker is killed (SIGKILL) once the snapshot after run 3 is stored, and run 4 through
the other replica restores the session there: every variable, `context_1` and the histories are
back. Another token can neither see nor continue the session, on any replica. In one process: a
worker lost before it stored the last run's snapshot leaves the one before, which the next run
restores, saying what is gone; an idle session's sandbox yields the worker's only slot to a run
and the session comes back from its snapshot; a run cancelled mid-cell (its REPL ends) leaves the
session its last snapshot rather than an empty REPL; with snapshots off, a session whose sandbox
was let go comes back with its contexts and histories and says its variables are gone."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager, ExitStack
from pathlib import Path

import anyio
import psycopg
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from prometheus_client import REGISTRY

from rlm_mcp.assembly import build_service
from rlm_mcp.owners import Owner
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_engine import cell, submit
from tests.fixtures_sessions import session_row
from tests.fixtures_surface import call, call_error, make_settings, resource_text
from tests.fixtures_team import SHORT_LEASES, Replica, cell_started, replica_client, team_replica

pytestmark = pytest.mark.anyio

ALICE, BOB = "alice-session-token", "bob-session-token"


def _team_metrics() -> tuple[float, float, float, float, float]:
    """(warm follow-ups, restored follow-ups, snapshots taken, their bytes, sessions live on this worker)."""

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    return (
        value("rlm_mcp_session_followups_total", how="warm"),
        value("rlm_mcp_session_followups_total", how="restored"),
        value("rlm_mcp_session_snapshot_bytes_count"),
        value("rlm_mcp_session_snapshot_bytes_sum"),
        value("rlm_mcp_sessions_open", mode="team", state="live"),
    )


def _grew(before: tuple[float, ...], after: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(b - a for a, b in zip(before, after, strict=True))


SCRIPT = Script(
    root_by_query=[
        RootScript(
            match="FIRST-Q",
            replies=[
                cell("counts = {w: context.count(w) for w in set(context.split())}\nprint(len(counts))"),
                submit('"built"'),
            ],
        ),
        RootScript(match="SECOND-Q", replies=[submit("f\"{counts['alpha']}|{context_1[:6]}|{history[0]['role']}\"")]),
        RootScript(
            match="SLOW-Q",
            replies=[cell("import time\ntime.sleep(4)\ntotal = sum(counts.values())"), submit("str(total)")],
        ),
        RootScript(
            match="THIRD-Q",
            replies=[
                submit("f\"{counts['alpha']}|{context_1[:6]}|{total}|{len(history_2) > 0}|{history is history_0}\"")
            ],
        ),
    ]
)


def run_worker(db: str, run_id: str) -> str:
    """The sandbox owner label of the worker that ran `run_id`."""
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute(
            "SELECT w.owner_id FROM rlm_runs r JOIN rlm_workers w ON w.worker_id = r.worker_id WHERE r.run_id = %s",
            (run_id,),
        ).fetchone()
    assert found is not None
    return str(found[0])


def as_token(r: Replica, token: str) -> AbstractAsyncContextManager[Client]:
    return replica_client(r, token)


@pytest.mark.parametrize("blobs", ["rows", "bucket"])
async def test_a_session_continues_on_another_replica_and_after_its_worker_is_killed(
    tmp_path: Path, pg_url: str, blobs: str, request: pytest.FixtureRequest
) -> None:
    # A long preference: the follow-up waits for the holder while it is alive, never for a lost one.
    env = {**SHORT_LEASES, "RLM_MCP_SESSION_PREFER_WORKER_S": "60"}
    if blobs == "bucket":  # contexts and snapshots in SeaweedFS: the database holds no bytes
        env |= {"RLM_MCP_BLOB_URL": request.getfixturevalue("bucket_url"), **request.getfixturevalue("seaweedfs").env()}
    with ScriptedLM(SCRIPT) as lm, ExitStack() as stack:
        a, b = (
            stack.enter_context(
                team_replica(
                    tmp_path / name, role="both", database_url=pg_url, lm_url=lm.base_url, tokens=[ALICE, BOB], env=env
                )
            )
            for name in ("a", "b")
        )
        async with as_token(a, ALICE) as on_a, as_token(b, ALICE) as on_b:
            first_ctx = (await call(on_a, "rlm_load_context", text="alpha beta alpha gamma"))["context_id"]
            second_ctx = (await call(on_b, "rlm_load_context", text="second context body"))["context_id"]
            one = await call(on_a, "rlm_complete", query="FIRST-Q", context_id=first_ctx, keep_session=True)
            assert one["status"] == "completed" and one["answer"] == "built"
            session_id = one["session_id"]
            holder = session_row(pg_url, session_id)["holder"]
            assert holder in (a.owner, b.owner)

            # Through the other replica, with a new context: run on the holder, in its live REPL.
            two = await call(on_b, "rlm_complete", query="SECOND-Q", context_id=second_ctx, session_id=session_id)
            assert two["status"] == "completed", two
            assert two["answer"] == "2|second|system" and two["session_id"] == session_id
            assert run_worker(pg_url, two["run_id"]) == holder

            # Two follow-ups at once, one through each replica: exactly one runs.
            started: list[str] = []
            refused: list[str] = []

            async def follow_up(client: Client) -> None:
                result = await client.call_tool("rlm_start", {"query": "SLOW-Q", "session_id": session_id})
                if result.is_error:
                    refused.append(" ".join(getattr(c, "text", "") for c in result.content))
                else:
                    assert result.structured_content is not None
                    started.append(result.structured_content["run_id"])

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow_up, on_a)
                tg.start_soon(follow_up, on_b)
            assert len(started) == 1 and len(refused) == 1, (started, refused)
            assert "one question at a time" in refused[0] and f"run_id={started[0]}" in refused[0]
            three = await call(on_a, "rlm_result", run_id=started[0], wait_s=120)
            assert three["status"] == "completed" and three["answer"] == "4", three

            # Listed and shown on both replicas; another token sees nothing and continues nothing.
            for client in (on_a, on_b):
                listed = (await call(client, "rlm_list_sessions"))["sessions"]
                assert [s["session_id"] for s in listed] == [session_id]
                assert listed[0]["runs"] == [one["run_id"], two["run_id"], started[0]]
                shown = json.loads(resource_text(await client.read_resource(f"rlm://sessions/{session_id}")))
                assert shown["context_ids"] == [first_ctx, second_ctx] and shown["histories"] == 3
            for replica in (a, b):
                async with as_token(replica, BOB) as bob:
                    assert (await call(bob, "rlm_list_sessions"))["sessions"] == []
                    error = await call_error(bob, "rlm_complete", query="THIRD-Q", session_id=session_id)
                    assert f"Unknown session id '{session_id}'" in error
                    error = await call_error(bob, "rlm_close_session", session_id=session_id)
                    assert "Unknown session id" in error
                    with pytest.raises(MCPError, match="Unknown session id"):
                        await bob.read_resource(f"rlm://sessions/{session_id}")

            # The snapshot after run 3 is stored in the background; then the holder is killed.
            await wait_until(
                lambda: session_row(pg_url, session_id)["snapshot_gen"] == 3, within_s=120, what="the snapshot"
            )
            victim, survivor, on_survivor = (a, b, on_b) if holder == a.owner else (b, a, on_a)
            assert session_row(pg_url, session_id)["holder"] == victim.owner
            victim.kill()

            four = await call(on_survivor, "rlm_complete", query="THIRD-Q", session_id=session_id)
            assert four["status"] == "completed", four
            assert four["answer"] == "2|second|4|True|True"
            assert run_worker(pg_url, four["run_id"]) == survivor.owner

            if blobs == "bucket":
                assert _bytes_in_rows(pg_url) == (0, 0)
                assert _objects(pg_url) == {"context": 2, "snapshot": 1}
            closed = await call(on_survivor, "rlm_close_session", session_id=session_id)
            assert closed["runs"][-1] == four["run_id"]
            if blobs == "bucket":  # the closed session's snapshot object went with it
                assert _objects(pg_url) == {"context": 2}
            error = await call_error(on_survivor, "rlm_complete", query="THIRD-Q", session_id=session_id)
            assert f"Session {session_id} was closed" in error and "keep_session=true" in error


def _bytes_in_rows(db: str) -> tuple[int, int]:
    with psycopg.connect(db) as conn:
        found = conn.execute(
            "SELECT (SELECT count(*) FROM rlm_blob_chunks), (SELECT count(*) FROM rlm_session_snapshots)"
        ).fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


def _objects(db: str) -> dict[str, int]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT CASE WHEN session_id IS NULL THEN 'context' ELSE 'snapshot' END, count(*) FROM rlm_objects "
            "WHERE state = 'live' GROUP BY 1"
        ).fetchall()
    return {kind: int(n) for kind, n in rows}


PARTIAL = Script(
    root_by_query=[
        RootScript(match="BUILD-Q", replies=[submit("str(len(counts := {'alpha': 2}))")]),
        RootScript(match="EXTRA-Q", replies=[submit("str(extra := 5)")]),
        RootScript(
            match="AFTER-LOSS-Q",
            replies=[
                cell("print(counts['alpha'], 'extra' in globals(), len(history_1) > 0)"),
                submit('"done"'),
            ],
        ),
    ]
)


async def test_a_worker_lost_before_its_last_snapshot_restores_the_one_before_and_says_so(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    # One in-process replica (front and worker). After run 2 the database is put back as if the
    # worker holding the session had been lost before it stored run 2's snapshot: run 1's snapshot,
    # no holder. Run 3 restores it: run 1's variables and every history are there, run 2's
    # variable is not, and the model is told so in its first REPL output.
    owner = Owner("local")
    with ScriptedLM(PARTIAL) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0, database_url=pg_migrated_url)
        instance = settings.sandbox.instance_id
        assert instance is not None
        async with build_service(settings) as service:
            caller = Caller(service, owner)
            ctx = await caller.load_context(text="alpha beta")
            _, sid = await caller.complete_in_session(
                "BUILD-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
            await wait_until(lambda: session_row(pg_migrated_url, sid)["snapshot_gen"] == 1, within_s=60, what="snap 1")
            first_snapshot = snapshot_chunks(pg_migrated_url, sid)
            extra, _ = await caller.complete_in_session("EXTRA-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert extra.answer == "5"
            await wait_until(lambda: session_row(pg_migrated_url, sid)["snapshot_gen"] == 2, within_s=60, what="snap 2")
            with psycopg.connect(pg_migrated_url, autocommit=True) as conn:
                conn.execute("DELETE FROM rlm_session_snapshots WHERE session_id = %s", (sid,))
                for idx, data in first_snapshot:
                    conn.execute("INSERT INTO rlm_session_snapshots VALUES (%s, %s, %s)", (sid, idx, data))
                conn.execute("UPDATE rlm_sessions SET snapshot_gen = 1, worker_id = NULL WHERE session_id = %s", (sid,))
            # The worker sees the session is no longer its own and lets its sandbox go.
            await wait_until(lambda: not sandbox_container_ids(instance), within_s=60, what="the sandbox let go")

            lm.reset_log()
            after, _ = await caller.complete_in_session("AFTER-LOSS-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert after.status == "completed" and after.answer == "done"
            second_call = json.dumps(lm.requests_by_role("root")[1]["body"]["messages"][-3:])
            assert "2 False True" in second_call  # counts from run 1, no `extra`, history_1 rebound
            assert (
                "snapshot stored after its first 1 run(s)" in second_call and "histories are all there" in second_call
            )


def snapshot_chunks(db: str, session_id: str) -> list[tuple[int, bytes]]:
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT idx, data FROM rlm_session_snapshots WHERE session_id = %s ORDER BY idx", (session_id,)
        ).fetchall()
    return [(int(i), bytes(d)) for i, d in rows]


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


async def test_an_idle_sessions_sandbox_yields_its_slot_to_a_run_and_comes_back(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    # One sandbox slot on the only worker: the idle session holds it, a plain run needs it. The
    # worker claims the run (an idle session's slot counts as free), the session gives its sandbox
    # back (its snapshot is in the database), and its next run restores it.
    back_again = RootScript(match="BACK-Q", replies=[cell("print(counts['alpha'], len(history) > 0)"), submit('"ok"')])
    script = Script(root=[submit('"plain"')], root_by_query=[*PARTIAL.root_by_query, back_again])
    owner = Owner("local")
    with ScriptedLM(script) as lm:
        settings = make_settings(
            tmp_path, lm.base_url, pool_size=0, max_sandboxes=1, database_url=pg_migrated_url, run_queue_timeout_s=120
        )
        instance = settings.sandbox.instance_id
        assert instance is not None
        async with build_service(settings) as service:
            caller = Caller(service, owner)
            ctx = await caller.load_context(text="alpha beta")
            at_start = _team_metrics()
            _, sid = await caller.complete_in_session(
                "BUILD-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
            await wait_until(lambda: session_row(pg_migrated_url, sid)["snapshot_gen"] == 1, within_s=60, what="snap 1")
            assert len(sandbox_container_ids(instance)) == 1  # the session's, idle
            warm, back, snapshots, snapshot_bytes, live = _grew(at_start, _team_metrics())
            assert (warm, back, snapshots, live) == (0, 0, 1, 1) and snapshot_bytes > 0  # /metrics

            plain = await caller.complete("another question", ctx.context_id, RunOverrides(), _quiet)
            assert plain.status == "completed" and plain.answer == "plain"
            assert session_row(pg_migrated_url, sid)["holder"] is None  # let go, kept in the database
            assert _grew(at_start, _team_metrics())[4] == 0  # no session live on this worker now

            lm.reset_log()
            after, _ = await caller.complete_in_session("BACK-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert after.status == "completed" and after.answer == "ok"
            restored = json.dumps(lm.requests_by_role("root")[1]["body"]["messages"][-3:])
            assert "2 True" in restored and "restored in a fresh sandbox" not in restored  # nothing lost
            warm, back, _, _, live = _grew(at_start, _team_metrics())
            assert (warm, back, live) == (0, 1, 1)  # /metrics: one follow-up, restored; live here again


async def test_a_run_cancelled_mid_cell_leaves_the_session_its_last_snapshot(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    # Cancelling a cell ends the REPL it ran in: the worker lets that sandbox go instead of
    # snapshotting an empty REPL over the session's last snapshot, and the next run restores it.
    stuck = RootScript(match="STUCK-Q", replies=[cell("import time\nwhile True:\n    time.sleep(0.2)")])
    back = RootScript(match="BACK-Q", replies=[cell("print(counts['alpha'], len(history) > 0)"), submit('"ok"')])
    owner = Owner("local")
    with ScriptedLM(Script(root_by_query=[*PARTIAL.root_by_query, stuck, back])) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0, database_url=pg_migrated_url)
        async with build_service(settings) as service:
            caller = Caller(service, owner)
            ctx = await caller.load_context(text="alpha beta")
            _, sid = await caller.complete_in_session(
                "BUILD-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
            await wait_until(lambda: session_row(pg_migrated_url, sid)["snapshot_gen"] == 1, within_s=60, what="snap 1")
            run = await caller.start_run("STUCK-Q", None, RunOverrides(), session_id=sid)

            await wait_until(lambda: cell_started(pg_migrated_url, run.run_id), within_s=60, what="the stuck cell")
            await caller.cancel(run.run_id)
            await wait_until(
                lambda: session_row(pg_migrated_url, sid)["generation"] == 2, within_s=60, what="the run's end"
            )

            lm.reset_log()
            after, _ = await caller.complete_in_session("BACK-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert after.status == "completed" and after.answer == "ok", after
            output = json.dumps(lm.requests_by_role("root")[1]["body"]["messages"][-3:])
            assert "2 True" in output and "snapshot stored after its first 1 run(s)" in output


async def test_a_session_without_a_snapshot_comes_back_with_its_contexts_and_histories(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    # Snapshots off: when the worker lets the sandbox go (here for a run that needs its only slot),
    # the next run starts a fresh REPL with the session's contexts and histories, and says the
    # variables are gone.
    look = RootScript(
        match="LOOK-Q", replies=[cell("print('counts' in globals(), len(history) > 0, context[:5])"), submit('"ok"')]
    )
    script = Script(root=[submit('"plain"')], root_by_query=[*PARTIAL.root_by_query, look])
    owner = Owner("local")
    with ScriptedLM(script) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            pool_size=0,
            max_sandboxes=1,
            database_url=pg_migrated_url,
            session_snapshot_max_bytes=0,
        )
        async with build_service(settings) as service:
            caller = Caller(service, owner)
            ctx = await caller.load_context(text="alpha beta")
            _, sid = await caller.complete_in_session(
                "BUILD-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None

            async def said_why() -> bool:
                return "snapshots are off" in str((await caller.session(sid))["snapshot_error"])

            await wait_until(said_why, within_s=60, what="the snapshot refused")
            plain = await caller.complete("another question", ctx.context_id, RunOverrides(), _quiet)
            assert plain.answer == "plain"

            lm.reset_log()
            after, _ = await caller.complete_in_session("LOOK-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert after.status == "completed" and after.answer == "ok"
            output = json.dumps(lm.requests_by_role("root")[1]["body"]["messages"][-3:])
            assert "False True alpha" in output and "no snapshot of its variables was stored" in output
