"""CPU per live-summary publish of a team worker's run log (`QueueRunLog.publish`): what one
turn's publish costs the worker's own process (its Python and driver work; the database's
share is not counted), for issue 39 item 6's team CPU per turn.

A claimed run with a realistic record (a query, limits, one model's usage) publishes, again
and again, the events one turn stages (turn_start, llm_call, cell) with its live summary, the
`lm_called` mark and the NOTIFY, through the same code as a worker: the record built from the
engine's live state (`RunRecord.of_live`, as `ActiveRun.record` builds it) and the fenced
statement. The figure is the process's CPU (/proc, user + system) per publish, so it stays
steady on a shared machine where wall times do not.

    .venv/bin/python bench/team_publish.py [--publishes 2000] [--rounds 1] [--profile]

With --rounds N, the publishes are measured N times over (one cluster, one run), each round's
figure printed and their median last: the rounds of one process are steadier to compare than
processes started one after another. --profile's clock is the thread's CPU time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlm_mcp.assembly import make_stores
from rlm_mcp.events import Cell, LLMCall, TurnStart
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import LiveSummary, RunLimits, RunRecord, RunRequest
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.store.pg import Database
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_postgres import Cluster

RUN = "run_publishbench0001"


def _live(turn: int) -> LiveSummary:
    total = {"calls": turn, "prompt_tokens": 900 * turn, "completion_tokens": 80 * turn}
    usage = {"total": total, "by_model": {"scripted-model": dict(total)}}
    return LiveSummary.model_validate(
        {
            "status": "running",
            "iterations": turn,
            "max_iterations": 30,
            "sub_calls": 0,
            "usage": usage,
            "elapsed_s": 0.5 * turn,
            "phase": "cell",
            "last_event": f"turn {turn}: running code",
        }
    )


def _turn_events(turn: int) -> list[TurnStart | LLMCall | Cell]:
    return [
        TurnStart(run_id=RUN, iteration=turn, max_iterations=30, depth=0),
        LLMCall(
            run_id=RUN, role="root", model="scripted-model", prompt_tokens=900, completion_tokens=80, latency_s=0.2,
            status="ok", finish_reason="stop", error=None, depth=0, iteration=turn,
        ),
        Cell(
            run_id=RUN, iteration=turn, block=0, code="x = sum(range(10))\nprint(x)", output="45\n",
            duration_s=0.01, error=None, timed_out=False, restarted=False, depth=0,
        ),
    ]  # fmt: skip


async def measure(url: str, tmp: Path, publishes: int, rounds: int, profile: bool) -> list[float]:
    settings = make_settings(tmp, database_url=url)
    async with make_stores(settings) as stores:
        db, runs = stores.lifecycle, stores.runs
        assert isinstance(db, Database) and isinstance(runs, PgRunStore)
        request = RunRequest(
            query="Summarise the quarterly figures in the attached context and name the three largest changes.",
            context_ids=["ctx_0123456789abcdef"],
            owner=Owner("token-bench"),
            limits=RunLimits(max_iterations=30, max_depth=1, timeout_s=600.0, token_budget=None, max_errors=3),
            model="scripted-model",
        )
        created = time.time()
        queued = RunRecord.of_live(_live(0), run_id=RUN, created_at=created, request=request)
        await runs.create(queued.model_copy(update={"status": "running"}))
        async with db.connection() as conn:  # a claim's attempt: every flush is the fenced statement
            await conn.execute("UPDATE rlm_runs SET attempt = 1, state = 'running' WHERE run_id = %s", (RUN,))
        log = QueueRunLog(await runs.reopen(RUN, attempt=1))
        lives = [_live(t + 1) for t in range(publishes)]
        for warm in range(20):  # connections opened, statements and caches warm
            assert await log.publish(RunRecord.of_live(lives[warm], run_id=RUN, created_at=created, request=request))
        profiler = cProfile.Profile(time.thread_time) if profile else None
        figures = []
        for _ in range(rounds):
            events = [_turn_events(t + 1) for t in range(publishes)]
            start = time.process_time()
            if profiler is not None:
                profiler.enable()
            for turn in range(publishes):
                for event in events[turn]:
                    await log.append(event)
                record = RunRecord.of_live(lives[turn], run_id=RUN, created_at=created, request=request)
                assert await log.publish(record)
            if profiler is not None:
                profiler.disable()
            figures.append((time.process_time() - start) / publishes)
        if profiler is not None:
            pstats.Stats(profiler).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(70)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions (slower)")
    args = parser.parse_args()
    cluster = Cluster()
    cluster.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            figures = anyio.run(measure, cluster.url(), Path(tmp), args.publishes, args.rounds, args.profile)
    finally:
        cluster.close()
    if len(figures) > 1:
        print("rounds: " + " ".join(f"{f * 1e6:.0f}" for f in figures) + " us")
    per = statistics.median(figures)
    print(f"publish: {per * 1e6:.0f} us CPU per publish (3 events, live summary, NOTIFY), {args.publishes} publishes")


if __name__ == "__main__":
    main()
