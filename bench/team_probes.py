"""The latency probes of `bench/scale.py team`: progress across replicas, cancel across replicas,
and a worker's death to its runs' final status."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.team_common import Db, call, client_of
from tests.fixtures_haproxy import Balanced


async def until(predicate: Any, within_s: float, what: str, every_s: float = 0.01) -> None:
    with anyio.fail_after(within_s):
        while not await predicate():
            await anyio.sleep(every_s)


async def progress_latency(front: Client, db: Db, context_id: str, runs: int) -> list[float]:
    """Turn starts on a worker to the front's progress notification that names the turn."""
    lags: list[float] = []
    for i in range(runs):
        seen: dict[int, float] = {}

        async def on_progress(
            progress: float, total: float | None, message: str | None, seen: dict[int, float] = seen
        ) -> None:
            now = time.time()
            if message and message.startswith("turn "):
                turn = int(message.split()[1].split("/")[0])
                seen.setdefault(turn, now)

        result = await front.call_tool(
            "rlm_complete",
            {"query": f"scale run progress {i}", "context_id": context_id, "max_iterations": 50},
            progress_callback=on_progress,
        )
        run_id = str((result.structured_content or {})["run_id"])
        starts = await db.turn_starts(run_id)
        lags += [seen[t] - ts for t, ts in starts.items() if t in seen and t > 1]
    return lags


async def cancel_latency(b: Balanced, context_id: str, times: int) -> tuple[list[float], list[float]]:
    """Start through rlm1, cancel through rlm3, read the status through rlm2."""
    answered: list[float] = []
    final: list[float] = []
    r1, r2, r3 = b.replicas
    async with client_of(r1.base) as c1, client_of(r2.base) as c2, client_of(r3.base) as c3:
        for i in range(times):
            run_id = (await call(c1, "rlm_start", query=f"long run cancel {i}", context_id=context_id))["run_id"]

            async def running(run_id: str = run_id) -> bool:
                status = await call(c2, "rlm_status", run_id=run_id)
                return status.get("status") == "running" and int(status.get("iterations", 0)) >= 1

            await until(running, 120, "the run to be running", every_s=0.05)
            t0 = time.perf_counter()
            await call(c3, "rlm_cancel", run_id=run_id)
            answered.append(time.perf_counter() - t0)

            async def ended(run_id: str = run_id) -> bool:
                return (await call(c2, "rlm_status", run_id=run_id)).get("status") == "cancelled"

            await until(ended, 120, "the run to be cancelled")
            final.append(time.perf_counter() - t0)
    return answered, final


async def worker_death(b: Balanced, db: Db, context_id: str, runs: int) -> tuple[list[float], list[str]]:
    """SIGKILL the worker holding the most long runs; time to each of its runs' final status."""
    front_replica = b.replicas[2]
    async with client_of(front_replica.base) as front:
        run_ids = [
            (await call(front, "rlm_start", query=f"long run death {i}", context_id=context_id))["run_id"]
            for i in range(runs)
        ]

        # The first turn counts as soon as it starts, before its LM call: a run killed then has no
        # answered call recorded and is queued again (by design), to sleep its cell once more on
        # another worker. So each run's `lm_called` mark is waited for too (written before its
        # cell runs): its worker's death then ends it.
        async def all_running() -> bool:
            statuses = [await call(front, "rlm_status", run_id=r) for r in run_ids]
            running = all(s.get("status") == "running" and int(s.get("iterations", 0)) >= 1 for s in statuses)
            return running and await db.lm_called(run_ids)

        await until(all_running, 600, "the long runs to be running with their LM's answer recorded", every_s=0.1)
        workers = await db.workers_of(run_ids)
        victim = next(r for r in b.replicas if str(r.pid) == max(workers, key=lambda pid: workers[pid]))
        victims = [r for r in run_ids if (await db.rows(
            "SELECT 1 FROM rlm_runs r JOIN rlm_workers w ON w.worker_id = r.worker_id WHERE r.run_id = %s AND w.pid = %s",
            (r, victim.pid),
        ))]  # fmt: skip
        print(f"  long runs per worker pid: {workers}; killing {victim.name} (pid {victim.pid}): {len(victims)} runs")
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.perf_counter()
        took: list[float] = []
        reasons: list[str] = []
        for run_id in victims:

            async def done(run_id: str = run_id) -> bool:
                return bool((await db.summary(run_id))["done"])

            await until(done, 300, "a lost worker's run to end", every_s=0.05)
            took.append(time.perf_counter() - killed)
            reasons.append(str(((await db.summary(run_id)).get("result") or {}).get("reason")))
        for run_id in run_ids:
            if run_id not in victims:
                await call(front, "rlm_cancel", run_id=run_id)
    return took, reasons
