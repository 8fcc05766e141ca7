"""Team mode's run queue end to end (issue 22 items 1-4): real `rlm-mcp serve` processes on one
PostgreSQL database, real Docker, the scripted LM.

A front (`--role front`) runs nothing: its runs are executed by worker replicas (`--role both`),
whose progress reaches the front's `rlm_complete`; a run's child RLM (`rlm_query`) runs inside it
on the worker that claimed it, never queued; status, result and cancel work through any replica;
a worker killed with SIGKILL leaves its run with a status naming it and no container behind; a
run that had not called the LM is queued again, once (after SIGKILL and after SIGTERM); a run
queued while no worker is alive says so and ends after the queue timeout; a PostgreSQL restart
mid-run ends in a final status. Leases are short here (RLM_MCP_WORKER_LEASE_S=6) so the tests stay quick.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.doctor import _team
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_postgres import Cluster
from tests.fixtures_surface import ANSWER_NOW, PARENT, STUCK, call
from tests.fixtures_team import cell_started, client, in_cell, replica, row

pytestmark = pytest.mark.anyio

# A first turn whose cell runs for a while, then the answer.
SLOW_THEN_ANSWER = """```repl
import time
time.sleep(2)
print("slept")
```"""


async def doctor(tmp_path: Path, db: str) -> dict[str, str]:
    """What `rlm-mcp doctor`'s team checks say, by check name."""
    settings = Settings(database_url=db, data_dir=tmp_path / "doctor")
    return {c.name: c.detail for c in await _team(settings)}


def run_events(db: str, run_id: str) -> list[dict[str, Any]]:
    """The events in a run's log (rlm_run_events), in order."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute("SELECT line FROM rlm_run_events WHERE run_id = %s ORDER BY seq", (run_id,)).fetchall()
    return [json.loads(line) for (line,) in rows]


def queue_rows(db: str) -> tuple[int, int]:
    """(claims ever made, run records): a child RLM adds to neither."""
    with psycopg.connect(db, autocommit=True) as conn:
        jobs = conn.execute("SELECT coalesce(sum(attempt), 0) FROM rlm_runs").fetchone()
        runs = conn.execute("SELECT count(*) FROM rlm_runs").fetchone()
    assert jobs is not None and runs is not None
    return int(jobs[0]), int(runs[0])


async def test_front_enqueues_workers_execute_progress_status_and_cancel_across_replicas(
    tmp_path: Path, pg_url: str
) -> None:
    script = Script(
        root_by_query=[
            {"match": "stuck", "replies": [STUCK]},
            {"match": "Answer the following: parent", "replies": [PARENT]},  # calls rlm_query
        ],
        root=[SLOW_THEN_ANSWER, ANSWER_NOW],  # and the child RLM too
    )
    with ScriptedLM(script) as lm, ExitStack() as stack:
        front = stack.enter_context(replica(tmp_path, "front", pg_url, lm.base_url, "front"))
        workers = [
            stack.enter_context(replica(tmp_path, f"w{i}", pg_url, lm.base_url, "both", RLM_MCP_MAX_RUNS="1"))
            for i in (1, 2)
        ]
        async with client(front) as on_front, client(workers[0]) as on_w1, client(workers[1]) as on_w2:
            cid = (await call(on_front, "rlm_load_context", text="queued haystack " * 500))["context_id"]

            # rlm_complete on the front: executed by a worker, its progress reaches this call.
            lines: list[str] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                lines.append(message or "")

            done = await on_front.call_tool(
                "rlm_complete", {"query": "what is it?", "context_id": cid}, progress_callback=on_progress
            )
            assert not done.is_error, done.content
            assert done.structured_content is not None and done.structured_content["answer"] == "forty-two"
            first = row(pg_url, done.structured_content["run_id"])
            assert first["owner"] in {w.owner for w in workers}
            assert first["followed"]  # a progress token: its worker publishes every turn
            assert any("turn 1/" in line for line in lines), lines
            assert any("turn 2/" in line for line in lines), lines

            # A child RLM (rlm_query with depth to spare) runs inside its parent's run on the
            # worker that claimed the parent, never through the queue: one job, one run record,
            # the child's events in the parent's log.
            queued_before = queue_rows(pg_url)
            deep = await call(on_front, "rlm_complete", query="parent question", context_id=cid, max_depth=2)
            assert deep["status"] == "completed" and deep["answer"] == "child said: forty-two", deep
            assert queue_rows(pg_url) == (queued_before[0] + 1, queued_before[1] + 1)
            events = run_events(pg_url, deep["run_id"])
            (child,) = [e["child_run_id"] for e in events if e["type"] == "child_start"]
            child_turns = [e for e in events if e["type"] == "turn_start" and e["run_id"] == child]
            assert child_turns and all(e["depth"] == 1 for e in child_turns), events
            assert any(e["type"] == "child_end" and e["status"] == "completed" for e in events), events
            parent = row(pg_url, deep["run_id"])
            assert parent["owner"] in {w.owner for w in workers} and parent["requeues"] == 0

            # Two runs at once with one run slot per worker: each worker takes one.
            started = [(await call(on_front, "rlm_start", query=f"run {i}", context_id=cid))["run_id"] for i in (1, 2)]
            for run_id in started:
                result = await call(on_w1, "rlm_result", run_id=run_id, wait_s=120)
                assert result["status"] == "completed", result
                assert not row(pg_url, run_id)["followed"]  # rlm_start: nobody follows its turns
            assert {row(pg_url, r)["owner"] for r in started} == {w.owner for w in workers}

            # Started through one worker, followed through the other, cancelled through the front.
            stuck = (await call(on_w1, "rlm_start", query="stuck", context_id=cid))["run_id"]
            await wait_until(lambda: in_cell(pg_url, stuck), within_s=120, what="the stuck cell to run")
            running = await call(on_w2, "rlm_status", run_id=stuck)
            assert running["status"] == "running" and "running on worker" in (running["notice"] or "")
            owner = row(pg_url, stuck)["owner"]
            assert sandbox_container_ids(owner)  # its sandbox is up
            seen = await doctor(tmp_path, pg_url)
            pids = {str(w.pid) for w in workers}
            assert {p for p in pids if f"pid {p} " in seen["workers"]} == pids, seen
            assert f"pid {row(pg_url, stuck)['pid']} (heartbeat" in seen["workers"] and "1 run)" in seen["workers"]
            assert seen["queue"] == "0 runs waiting"
            cancelled = await call(on_front, "rlm_cancel", run_id=stuck)
            assert cancelled["status"] == "cancelled", cancelled
            result = await call(on_w2, "rlm_result", run_id=stuck, wait_s=60)
            assert result["status"] == "cancelled"
            await wait_until(lambda: not sandbox_container_ids(owner), within_s=60, what="the cancelled sandbox to go")


async def test_a_killed_worker_leaves_a_final_status_and_no_container(tmp_path: Path, pg_url: str) -> None:
    script = Script(root=[STUCK])
    with ScriptedLM(script) as lm, ExitStack() as stack:
        front = stack.enter_context(replica(tmp_path, "front", pg_url, lm.base_url, "front"))
        # One worker-only process (no MCP: its port serves /healthz alone) and one `both`.
        workers = [
            stack.enter_context(replica(tmp_path, f"w{i}", pg_url, lm.base_url, role))
            for i, role in ((1, "worker"), (2, "both"))
        ]
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{workers[0].base}/healthz")
            assert health.status_code == 200 and health.json()["role"] == "worker"
            assert (await http.get(f"{workers[0].base}/mcp")).status_code == 404
        async with client(front) as on_front:
            cid = (await call(on_front, "rlm_load_context", text="doomed haystack " * 500))["context_id"]
            run_id = (await call(on_front, "rlm_start", query="q", context_id=cid))["run_id"]
            # Killed as soon as the cell starts, before the worker publishes that the LM answered:
            # the run must not be queued again (its code may have run), whatever the summary says.
            await wait_until(lambda: cell_started(pg_url, run_id), within_s=120, what="the cell to start")
            where = row(pg_url, run_id)
            victim = next(w for w in workers if w.owner == where["owner"])
            assert sandbox_container_ids(victim.owner)
            victim.kill()  # SIGKILL: no clean-up of its own

            result = await call(on_front, "rlm_result", run_id=run_id, wait_s=60)
            if result["status"] == "running":
                result = await call(on_front, "rlm_result", run_id=run_id, wait_s=60)
            assert result["status"] == "error", result
            assert f"pid {where['pid']}" in result["reason"] and "rlm_start" in result["reason"]
            assert row(pg_url, run_id)["requeues"] == 0
            await wait_until(
                lambda: not sandbox_container_ids(victim.owner), within_s=60, what="the lost worker's sandbox removal"
            )


@pytest.mark.parametrize(
    ("stop", "role"),
    [
        pytest.param("kill", "both", id="SIGKILL-both"),  # lost: a sweeper queues the run again
        pytest.param("terminate", "worker", id="SIGTERM-worker"),  # a clean stop hands the run back
    ],
)
async def test_a_run_whose_worker_stops_before_its_first_lm_reply_is_queued_again_once(
    tmp_path: Path, pg_url: str, stop: str, role: str
) -> None:
    # The first root call hangs (the LM is slow) while its worker stops: nothing was recorded.
    script = Script(root=[ANSWER_NOW], faults=[{"when": "root", "turn": 1, "delay_s": 120, "times": 1}])
    with ScriptedLM(script) as lm, ExitStack() as stack:
        front = stack.enter_context(replica(tmp_path, "front", pg_url, lm.base_url, "front"))
        first = stack.enter_context(replica(tmp_path, "w1", pg_url, lm.base_url, role))
        async with client(front) as on_front:
            cid = (await call(on_front, "rlm_load_context", text=f"queued again after {stop} " * 500))["context_id"]
            run_id = (await call(on_front, "rlm_start", query="q", context_id=cid))["run_id"]
            await wait_until(lambda: len(lm.requests_by_role("root")) >= 1, within_s=120, what="the first LM call")
            if stop == "kill":
                first.kill()
            else:
                first.proc.terminate()
                first.proc.wait(timeout=60)

            async def queued_again() -> bool:
                queued = await call(on_front, "rlm_status", run_id=run_id)
                return queued["status"] == "queued" and "queued again" in (queued["notice"] or "")

            # SIGTERM: at once; SIGKILL: once the lease (6 s) has expired and a sweeper ran.
            await wait_until(queued_again, within_s=60, what="rlm_status to show the run queued again")

            async def both_said() -> bool:  # the front's "no worker" sentence follows, never replaces
                notice = (await call(on_front, "rlm_status", run_id=run_id))["notice"] or ""
                return "queued again" in notice and "no worker is alive" in notice

            await wait_until(
                both_said, within_s=60, what="rlm_status to say it was queued again and no worker is alive"
            )
            stack.enter_context(replica(tmp_path, "w2", pg_url, lm.base_url, role))
            result = await call(on_front, "rlm_result", run_id=run_id, wait_s=120)
            if result["status"] in ("queued", "running"):
                result = await call(on_front, "rlm_result", run_id=run_id, wait_s=120)
            assert result["status"] == "completed" and result["answer"] == "forty-two", result
            assert row(pg_url, run_id)["requeues"] == 1


async def test_a_run_queued_with_no_live_worker_says_so_and_times_out(tmp_path: Path, pg_url: str) -> None:
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm, ExitStack() as stack:
        front = stack.enter_context(
            replica(tmp_path, "front", pg_url, lm.base_url, "front", RLM_MCP_RUN_QUEUE_TIMEOUT_S="15")
        )
        async with client(front) as on_front:
            cid = (await call(on_front, "rlm_load_context", text="lonely haystack " * 100))["context_id"]
            run_id = (await call(on_front, "rlm_start", query="q", context_id=cid))["run_id"]

            async def says_no_worker() -> bool:
                status = await call(on_front, "rlm_status", run_id=run_id)
                return status["status"] == "queued" and "no worker is alive" in (status["notice"] or "")

            await wait_until(says_no_worker, within_s=30, what="rlm_status to say no worker is alive")
            seen = await doctor(tmp_path, pg_url)
            assert seen["workers"] == "none alive" and seen["queue"] == "1 run waiting", seen
            result = await call(on_front, "rlm_result", run_id=run_id, wait_s=60)
            assert result["status"] == "error", result
            assert "No worker took the run" in result["reason"] and "no worker is alive" in result["reason"]


async def test_a_postgresql_restart_mid_run_ends_in_a_final_status(
    tmp_path: Path, pg_url: str, pg_cluster: Cluster
) -> None:
    script = Script(root=[SLOW_THEN_ANSWER, SLOW_THEN_ANSWER, ANSWER_NOW])
    with ScriptedLM(script) as lm, ExitStack() as stack:
        front = stack.enter_context(replica(tmp_path, "front", pg_url, lm.base_url, "front"))
        worker = stack.enter_context(replica(tmp_path, "w1", pg_url, lm.base_url, "both"))
        async with client(front) as on_front:
            cid = (await call(on_front, "rlm_load_context", text="restarted haystack " * 100))["context_id"]
            run_id = (await call(on_front, "rlm_start", query="q", context_id=cid))["run_id"]
            await wait_until(lambda: in_cell(pg_url, run_id), within_s=120, what="the first cell to run")
            pg_cluster.stop()
            pg_cluster.start()
        # Both processes reconnect by themselves: a new client on each sees the final status.
        async with client(front) as on_front, client(worker) as on_worker:
            result = await call(on_front, "rlm_result", run_id=run_id, wait_s=120)
            if result["status"] in ("queued", "running"):
                result = await call(on_front, "rlm_result", run_id=run_id, wait_s=120)
            assert result["status"] in ("completed", "error"), result
            assert (await call(on_worker, "rlm_status", run_id=run_id))["status"] == result["status"]
            # and the queue still works after the restart
            again = await call(on_front, "rlm_complete", query="again", context_id=cid)
            assert again["status"] in ("completed",), again


def attempts(db: str, run_id: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute(
            "SELECT attempt FROM rlm_runs WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    return int(found[0]) if found else 0


async def test_a_worker_claims_a_run_only_with_the_sandbox_slots_its_depth_may_need(
    tmp_path: Path, pg_url: str
) -> None:
    script = Script(root_by_query=[{"match": "stuck", "replies": [STUCK]}], root=[ANSWER_NOW])
    with ScriptedLM(script) as lm, ExitStack() as stack:
        worker = stack.enter_context(
            replica(tmp_path, "w1", pg_url, lm.base_url, "both", RLM_MCP_MAX_SANDBOXES="2", RLM_MCP_MAX_RUNS="2")
        )
        async with client(worker) as on_worker:
            cid = (await call(on_worker, "rlm_load_context", text="gated haystack " * 100))["context_id"]
            stuck = (await call(on_worker, "rlm_start", query="stuck", context_id=cid))["run_id"]
            await wait_until(lambda: in_cell(pg_url, stuck), within_s=120, what="the stuck cell to run")
            # One sandbox slot left: a run that may need two (max_depth 2) is not claimed, while a
            # later one that needs one is (claims look at the queue in order, gated by the need).
            deep = (await call(on_worker, "rlm_start", query="deep", context_id=cid, max_depth=2))["run_id"]
            shallow = (await call(on_worker, "rlm_start", query="shallow", context_id=cid, max_depth=1))["run_id"]
            done = await call(on_worker, "rlm_result", run_id=shallow, wait_s=120)
            assert done["status"] == "completed", done
            assert attempts(pg_url, deep) == 0
            assert (await call(on_worker, "rlm_status", run_id=deep))["status"] == "queued"
            await call(on_worker, "rlm_cancel", run_id=stuck)
            result = await call(on_worker, "rlm_result", run_id=deep, wait_s=120)
            assert result["status"] == "completed" and result["answer"] == "forty-two", result
