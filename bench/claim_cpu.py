"""The client's CPU for the queue's statements, one at a time. Run by hand.

    .venv/bin/python bench/claim_cpu.py [--runs 200] [--rounds 5]

On a private PostgreSQL cluster (the test fixtures' `Cluster`) and the team store, one worker
registered: each run is enqueued (`PgRunQueue.enqueue`, one statement), claimed (`claim`: the
lock with its BEGIN, then the claim with its COMMIT, two round trips), and claimed again on the
now empty queue (what a worker woken for a run another worker took pays); then ended by hand, so
the owner's share never stops the next claim. Per round, the median thread CPU
(`time.thread_time`, this process's event loop) of each call. Never fails on a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from tests.fixtures_postgres import Cluster
from tests.fixtures_store import run_record

LIMITS = {"max_iterations": 5, "max_depth": 1, "timeout_s": 60.0, "token_budget": None, "max_errors": 3}


def us(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e6:.0f} us"


async def measure(url: str, data: Path, runs: int, rounds: int) -> None:
    settings = Settings(database_url=url, data_dir=data)
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        queue = PgRunQueue(queue_rules(settings.queue), db)
        worker = await queue.register_worker("bench-claims", 64)
        for n in range(rounds):
            enqueue, claim, empty = [], [], []
            for i in range(runs):
                run_id = f"bench-claim-{n}-{i:05d}"
                stored = {"query": "q", "context_ids": [], "owner": "local", "limits": LIMITS, "status": "queued"}
                t0 = time.thread_time()
                await queue.enqueue(run_record(run_id, stored), 1)
                t1 = time.thread_time()
                row = await queue.claim(worker, 4, 4)
                t2 = time.thread_time()
                nothing = await queue.claim(worker, 4, 4)
                t3 = time.thread_time()
                assert row is not None and row.run_id == run_id and nothing is None
                enqueue.append(t1 - t0)
                claim.append(t2 - t1)
                empty.append(t3 - t2)
                async with db.connection() as conn:  # ended, outside the timing
                    await conn.execute("UPDATE rlm_runs SET state = 'done' WHERE run_id = %s", (run_id,))
            print(
                f"round {n + 1}/{rounds}: enqueue {us(enqueue)}, claim {us(claim)}, "
                f"empty claim {us(empty)} (thread CPU, median of {runs})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="runs per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the first warms the pool and the statements)")
    args = parser.parse_args()
    cluster = Cluster()
    cluster.start()
    try:
        with tempfile.TemporaryDirectory(prefix="rlm-claim-cpu-") as tmp:
            anyio.run(measure, cluster.url(), Path(tmp), args.runs, args.rounds)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
