"""rlm-mcp behind HAProxy, team mode's runs: with two `--role both` workers and a `--role front`,
runs spread over both workers and any replica starts, polls and cancels any run; a worker killed
with SIGKILL mid-run leaves its run ended with a status naming it and no container, and runs
outlive a PostgreSQL restart, all read through the balancer (tests/e2e/test_haproxy.py has the
recipe, the sessions and the health checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_haproxy import (
    balanced_replicas,
    health_status,
    mcp_client,
    served_by,
)
from tests.fixtures_postgres import Cluster
from tests.fixtures_surface import ANSWER_NOW, STUCK, call
from tests.fixtures_team import SHORT_LEASES, in_cell, replica_client, row

pytestmark = pytest.mark.anyio

ALICE = "alice-lb-token"


# Two workers with one run slot each, a front that runs nothing.
ROLES = ["both", "both", "front"]
QUEUE_ENV = {**SHORT_LEASES, "RLM_MCP_MAX_RUNS": "1"}
SLOW_THEN_ANSWER = """```repl
import time
time.sleep(2)
print("slept")
```"""
# A cell that is still running when PostgreSQL goes away (the restart takes a second or two).
LONG_CELL_THEN_ANSWER = """```repl
import time
time.sleep(4)
print("slept through it")
```"""
SCRIPT = Script(
    root_by_query=[
        RootScript(match="stuck", replies=[STUCK]),
        RootScript(match="slow run", replies=[SLOW_THEN_ANSWER, ANSWER_NOW]),
        RootScript(match="restart run", replies=[LONG_CELL_THEN_ANSWER, ANSWER_NOW]),
    ],
    root=[ANSWER_NOW],
)


async def test_stateless_calls_spread_over_replicas_and_any_replica_drives_any_run(tmp_path: Path, pg_url: str) -> None:
    with (
        ScriptedLM(SCRIPT) as lm,
        balanced_replicas(
            tmp_path, database_url=pg_url, lm_url=lm.base_url, tokens=[ALICE], roles=ROLES, env=QUEUE_ENV
        ) as balanced,
    ):
        async with mcp_client(balanced, "2026-07-28", ALICE) as client:
            assert client.protocol_version == "2026-07-28"
            await client.list_tools()  # the client checks results against the tools' schemas: fetched once here
            loaded_on: dict[str, str] = {}
            for i in range(3):
                before = balanced.requests()
                loaded = await call(client, "rlm_load_context", text=f"stateless haystack {i} " * 100, name=f"s{i}")
                loaded_on[loaded["context_id"]] = await served_by(balanced, before)
            listed_on = set()
            for _ in range(3):
                before = balanced.requests()
                listed = await call(client, "rlm_list_contexts")
                assert {c["context_id"] for c in listed["contexts"]} == set(loaded_on)
                listed_on.add(await served_by(balanced, before))
            before = balanced.requests()
            said: list[str] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                said.append(message or "")

            completed = await client.call_tool(
                "rlm_complete", {"query": "what is it?", "context_id": list(loaded_on)}, progress_callback=on_progress
            )
            ran_on = await served_by(balanced, before)
            assert not completed.is_error and completed.structured_content is not None, completed.content
            done = completed.structured_content
            assert done["answer"] == "forty-two"
            assert any("turn 1/" in line for line in said), said  # streamed through the balancer
            before = balanced.requests()
            status = await call(client, "rlm_status", run_id=done["run_id"])
            assert status["status"] == "completed"
            read_on = await served_by(balanced, before)
            # every replica served calls; the run used contexts loaded through the other replicas
            assert set(loaded_on.values()) | listed_on | {ran_on, read_on} == {r.name for r in balanced.replicas}
            assert {on for on in loaded_on.values() if on != ran_on}
            cid = next(iter(loaded_on))

            # Two runs at once, one run slot per worker: each worker takes one (the front none).
            workers = {r.owner for r in balanced.replicas if r.role != "front"}
            slow = [(await call(client, "rlm_start", query=f"slow run {i}", context_id=cid))["run_id"] for i in (1, 2)]
            for run_id in slow:
                assert (await call(client, "rlm_result", run_id=run_id, wait_s=120))["status"] == "completed"
            assert {row(pg_url, run_id)["owner"] for run_id in slow} == workers

            # Start through one replica, poll through another, cancel through the third.
            before = balanced.requests()
            stuck = (await call(client, "rlm_start", query="stuck", context_id=cid))["run_id"]
            started_on = await served_by(balanced, before)
            await wait_until(lambda: in_cell(pg_url, stuck), within_s=120, what="the stuck run's cell")
            polled_on = started_on
            while polled_on == started_on:  # round robin: at most two calls
                before = balanced.requests()
                assert (await call(client, "rlm_status", run_id=stuck))["status"] == "running"
                polled_on = await served_by(balanced, before)
            (third,) = [r for r in balanced.replicas if r.name not in (started_on, polled_on)]
            async with replica_client(third, ALICE) as on_third:
                await call(on_third, "rlm_cancel", run_id=stuck)
            final = await call(client, "rlm_result", run_id=stuck, wait_s=120)
            assert final["status"] == "cancelled", final
            owner = row(pg_url, stuck)["owner"]
            assert owner in workers
            await wait_until(
                lambda: not sandbox_container_ids(owner), within_s=60, what="the cancelled run's sandbox removed"
            )


async def final_result(client: Client, run_id: str, within_s: float = 180.0) -> dict[str, Any]:
    """The run's result once it has ended (rlm_result long-polls, asked again until then; a
    replica that has not reached PostgreSQL again after a restart answers so, and is asked again)."""
    seen: dict[str, Any] = {}

    async def ended() -> bool:
        answer = await client.call_tool("rlm_result", {"run_id": run_id, "wait_s": 20})
        if answer.is_error:
            text = " ".join(getattr(c, "text", "") for c in answer.content)
            assert "is unreachable" in text, text  # the database, for a moment: nothing else
            return False
        assert answer.structured_content is not None
        seen.update(answer.structured_content)
        return seen["status"] not in ("queued", "running")

    await wait_until(ended, within_s=within_s, what=f"run {run_id} to end")
    return seen


async def test_runs_through_the_balancer_survive_a_killed_worker_and_a_postgresql_restart(
    tmp_path: Path, pg_cluster: Cluster, pg_url: str
) -> None:
    with (
        ScriptedLM(SCRIPT) as lm,
        balanced_replicas(
            tmp_path, database_url=pg_url, lm_url=lm.base_url, tokens=[ALICE], roles=ROLES, env=QUEUE_ENV
        ) as balanced,
    ):
        workers = [r for r in balanced.replicas if r.role != "front"]
        (front,) = [r for r in balanced.replicas if r.role == "front"]
        async with mcp_client(balanced, "2026-07-28", ALICE) as client:
            await client.list_tools()  # the client checks results against the tools' schemas: fetched once here
            cid = (await call(client, "rlm_load_context", text="survivor haystack " * 100))["context_id"]

            # kill -9 the worker running a run whose model has answered (its cell is running):
            # the run ends `error` naming the lost worker, read through the balancer.
            doomed = (await call(client, "rlm_start", query="stuck", context_id=cid))["run_id"]
            await wait_until(lambda: in_cell(pg_url, doomed), within_s=120, what="the doomed run's cell")
            owner = row(pg_url, doomed)["owner"]
            (victim,) = [r for r in workers if r.owner == owner]
            (survivor,) = [r for r in workers if r is not victim]
            assert sandbox_container_ids(victim.owner)
            victim.kill()
            await wait_until(lambda: balanced.server_down(victim.name), within_s=60, what="HAProxy to drop the dead")
            lost = await final_result(client, doomed)
            assert lost["status"] == "error", lost
            assert f"pid {victim.pid})" in lost["reason"] and "rlm_start" in lost["reason"], lost
            await wait_until(
                lambda: not sandbox_container_ids(victim.owner), within_s=60, what="the lost worker's sandbox removed"
            )

            # PostgreSQL restarted while the surviving worker runs a cell: the run still ends
            # with a structured status, and the replicas answer through the balancer again.
            slow = (await call(client, "rlm_start", query="restart run", context_id=cid))["run_id"]
            await wait_until(lambda: in_cell(pg_url, slow), within_s=120, what="the slow run's cell")
            assert row(pg_url, slow)["owner"] == survivor.owner
            pg_cluster.stop()
            pg_cluster.start()
            live = [survivor, front]
            await wait_until(
                lambda: all(health_status(r.base) == 200 for r in live), within_s=120, what="both to reconnect"
            )
            # HAProxy may have taken them out during the outage (checks every 2 s): back after 2 good ones.
            await wait_until(
                lambda: not any(balanced.server_down(r.name) for r in live), within_s=60, what="HAProxy to use both"
            )
            ended = await final_result(client, slow)
            assert ended["status"] in ("completed", "error"), ended
            assert ended["status"] == "completed" or ended["reason"], ended
            served: set[str] = set()

            async def both_serve() -> bool:
                before = balanced.requests()
                await client.list_tools()
                served.add(await served_by(balanced, before))
                return served == {r.name for r in live}

            await wait_until(both_serve, within_s=60, what="both live replicas to answer through the balancer")
            again = await call(client, "rlm_complete", query="after the restart", context_id=cid)
            assert again["status"] == "completed" and again["answer"] == "forty-two", again
