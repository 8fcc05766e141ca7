"""A run executes at most once at a time, and no outage loses it (team mode, real processes, real
Docker, the scripted LM): a worker frozen (SIGSTOP) past its lease while its run waits on the
model loses the run to another worker; resumed (SIGCONT), it stops the run at once, writes
nothing more for it and calls the model no more, and the run has one final status, the second
attempt's. A database outage longer than the lease ends no run and queues none again."""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from pathlib import Path

import anyio
import psycopg
import pytest

from rlm_mcp.testing.script import Fault, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_postgres import Cluster
from tests.fixtures_surface import ANSWER_NOW, call
from tests.fixtures_team import client, in_cell, replica, row

pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.postgres]


def attempt_rows(db: str, run_id: str) -> dict[int, int]:
    """The run's event rows per attempt."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT attempt, count(*) FROM rlm_run_events WHERE run_id = %s GROUP BY attempt", (run_id,)
        ).fetchall()
    return {int(a): int(n) for a, n in rows}


def attempt_of(db: str, run_id: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute("SELECT attempt FROM rlm_runs WHERE run_id = %s", (run_id,)).fetchone()
    return int(found[0]) if found else 0


async def test_a_frozen_worker_resumed_after_its_run_was_claimed_again_stops_it(tmp_path: Path, pg_url: str) -> None:
    # The first root call (the frozen worker's) is answered only after 20 s; the second attempt's
    # is answered at once, with the answer.
    script = Script(root=[ANSWER_NOW], faults=[Fault(when="root", turn=1, delay_s=20.0, times=1)])
    with ScriptedLM(script) as lm, ExitStack() as stack:
        front = stack.enter_context(replica(tmp_path, "front", pg_url, lm.base_url, "front"))
        # Its run is followed by nobody (rlm_start): publishing it as often as a followed one
        # writes the first attempt's events before the freeze, whose fence is checked below.
        frozen = stack.enter_context(
            replica(tmp_path, "frozen", pg_url, lm.base_url, "worker", RLM_MCP_LIVE_SUMMARY_UNFOLLOWED_INTERVAL_S="0.1")
        )
        async with client(front) as on_front:
            cid = (await call(on_front, "rlm_load_context", text="frozen haystack " * 100))["context_id"]
            run_id = (await call(on_front, "rlm_start", query="q", context_id=cid))["run_id"]
            await wait_until(lambda: len(lm.requests_by_role("root")) == 1, within_s=120, what="the first LM call")
            # Its events before the call are written by its next publish (the LM call is held 20 s).
            await wait_until(lambda: 1 in attempt_rows(pg_url, run_id), within_s=15, what="the first attempt's events")
            assert row(pg_url, run_id)["owner"] == frozen.owner
            os.kill(frozen.pid, signal.SIGSTOP)  # a paused VM: it holds the run and its LM call
            try:
                second = stack.enter_context(replica(tmp_path, "second", pg_url, lm.base_url, "worker"))
                result = await call(on_front, "rlm_result", run_id=run_id, wait_s=120)
                if result["status"] in ("queued", "running"):
                    result = await call(on_front, "rlm_result", run_id=run_id, wait_s=120)
                assert result["status"] == "completed" and result["answer"] == "forty-two", result
                assert row(pg_url, run_id)["owner"] == second.owner and attempt_of(pg_url, run_id) == 2
                before = attempt_rows(pg_url, run_id)
                calls_before = len(lm.requests_by_role("root"))
                assert calls_before == 2
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
            await wait_until(
                lambda: f"run {run_id} stopped on worker" in frozen.text(),
                within_s=60,
                what="the resumed worker to stop",
            )
            await wait_until(
                lambda: not sandbox_container_ids(frozen.owner), within_s=60, what="the frozen worker's sandbox removal"
            )
            # Nothing more from the first attempt: no LM call, no event row, no second status.
            assert len(lm.requests_by_role("root")) == calls_before
            assert attempt_rows(pg_url, run_id) == before and set(before) == {1, 2}
            final = await call(on_front, "rlm_status", run_id=run_id)
            assert final["status"] == "completed"
            assert row(pg_url, run_id)["summary"]["result"]["status"] == "completed"


# A first turn whose cell outlasts the database outage below (by about as much as the outage
# outlasts the lease), then the answer.
LONG_CELL = """```repl
import time
time.sleep(18)
print("slept through it")
```"""


async def test_a_database_outage_longer_than_the_lease_loses_no_run(
    tmp_path: Path, pg_cluster: Cluster, pg_url: str
) -> None:
    """PostgreSQL away for 9 s under a 6 s lease, while a run's cell runs: the worker holds its
    run (no LM call, no new cell) until a heartbeat answers, the sweepers wait a full lease after
    the database is back before they judge any lease, and the run ends `completed` on its first
    attempt, never queued again and never ended as a lost worker's."""
    script = Script(root=[LONG_CELL, ANSWER_NOW])
    with ScriptedLM(script) as lm, ExitStack() as stack:
        both = stack.enter_context(replica(tmp_path, "both", pg_url, lm.base_url, "both"))
        async with client(both) as on_both:
            cid = (await call(on_both, "rlm_load_context", text="outage haystack " * 100))["context_id"]
            run_id = (await call(on_both, "rlm_start", query="q", context_id=cid))["run_id"]
            await wait_until(lambda: in_cell(pg_url, run_id), within_s=120, what="the long cell to run")
        pg_cluster.stop()
        try:
            # The outage itself (what is tested), not a wait for a condition: one and a half leases, so
            # the heartbeat is a lease old when the database comes back (a sweeper that judged it at once
            # would queue the run again).
            await anyio.sleep(9)
        finally:
            pg_cluster.start()
        async with client(both) as on_both:
            result = await call(on_both, "rlm_result", run_id=run_id, wait_s=120)
            if result["status"] in ("queued", "running"):
                result = await call(on_both, "rlm_result", run_id=run_id, wait_s=120)
        assert result["status"] == "completed" and result["answer"] == "forty-two", result
        assert attempt_of(pg_url, run_id) == 1 and row(pg_url, run_id)["requeues"] == 0
        assert len(lm.requests_by_role("root")) == 2
