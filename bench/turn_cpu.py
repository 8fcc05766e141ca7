"""Event-loop thread CPU per further root turn: the steadiest figure behind compare_reference.py's
"further turn" on a shared machine.

    .venv/bin/python bench/turn_cpu.py [--runs 6] [--turns 10] [--profile PREFIX]

The same service as bench/run.py (a real sandbox, the scripted LM in a subprocess), running
compare_reference.py's `ten_1m` trajectory: `print(len(context))` on a 1 MiB context, then the
answer. What is timed is the event loop thread's own CPU (`time.thread_time`) over turns 2 to N-1
of each run (the first turn waits for the sandbox, the last ends the run): the reply's parsing, the
cell's frames, the events, the next request's building and sending, and whatever else the loop
thread ran meanwhile. A turn's wall time on a loaded 2-core machine follows whoever else holds the
cores; this follows only what this thread did. Processes other than this one (the scripted LM, the
sandbox, Docker) are not counted: compare_reference.py shows them per process. Beside it, the
event-loop rounds per turn: the same from run to run for the same code, so a round removed shows
where the CPU figure is within its noise.

To compare two trees, run this file with each tree's interpreter from that tree's folder
(`cd OLD && .venv/bin/python /path/to/bench/turn_cpu.py`), alternating: it imports the rlm_mcp
of the folder it is run from.

`--phases` also prints the loop thread's CPU inside each call of the turn's parts over the same
turns (the LM client's call, its HTTP request, the cell, each kind of run-log append): time the
loop thread spent in a call while it awaited counts too, whatever ran meanwhile (the progress
waiter the turn's `turn_start` wakes runs during the LM request). Unlike `--profile` it adds only
two clock reads per call.

`--profile PREFIX` also writes cProfile data with the thread-CPU clock over those turns
(PREFIX.turns; read with `pstats`). Profiled times are inflated by the profiler's cost per call,
so read shares, not microseconds. Never fails on a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio

# The rlm_mcp of the folder this is run from (another tree's, for a comparison), then its bench.
sys.path.insert(0, os.getcwd())
from rlm_mcp.assembly import build_service
from rlm_mcp.cli.collector import tune_for_serving
from rlm_mcp.config import Settings
from rlm_mcp.engine.turn import TurnRunner
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing import scripted_lm_process

TURN = "```repl\nprint(len(context))\n```"
DONE = '```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```'
GAP_S = 1.5  # idle before each run: the warm pool refills only while no sandbox is in use


def script(turns: int) -> dict[str, Any]:
    return {
        "root_by_query": [{"match": "turns:", "replies": [TURN] * (turns - 1) + [DONE]}],
        "sub_default": "ok",
        "max_model_len": 65536,
    }


@asynccontextmanager
async def service_for(turns: int) -> AsyncIterator[Any]:
    with tempfile.TemporaryDirectory() as tmp, scripted_lm_process(script(turns)) as url:
        settings = Settings(base_url=url, data_dir=Path(tmp) / "data", allowed_roots=[Path(tmp)], pool_size=2)
        async with build_service(settings) as service:
            yield service


class _RoundCounter:
    """Counts the loop's rounds (`_run_once`): the same in every run for the same code, unlike
    CPU time on a shared machine, so a round removed shows even where the CPU figure is noise."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.rounds = 0
        self._loop: Any = cast(Any, loop)  # its private `_run_once`, wrapped
        run_once = self._loop._run_once

        def counted() -> None:
            self.rounds += 1
            run_once()

        self._loop._run_once = counted

    def close(self) -> None:
        del self._loop._run_once  # the class's method again


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


class _Phases:
    """Thread CPU inside the calls of a turn's parts, while `on` (the timed turns)."""

    PARTS = (
        ("rlm_mcp.lm.client", "LMClient", "complete", "LM call"),
        ("rlm_mcp.lm.http", "HttpPool", "request", "LM call: its HTTP request"),
        ("rlm_mcp.sandbox.session", "KernelSandbox", "execute", "cell"),
    )

    def __init__(self) -> None:
        self.on = False
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._undo: list[tuple[type, str, Any]] = []

    def _count(self, key: str, started: float) -> None:
        if self.on:
            self.spent[key] = self.spent.get(key, 0.0) + time.thread_time() - started
            self.calls[key] = self.calls.get(key, 0) + 1

    def _wrap(self, cls: type, name: str, key: Any) -> None:
        original = cls.__dict__[name]
        phases = self

        async def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return await original(obj, *args, **kwargs)
            finally:
                phases._count(key(args) if callable(key) else key, started)

        setattr(cls, name, timed)
        self._undo.append((cls, name, original))

    def install(self) -> None:
        import importlib

        for module, cls_name, method, label in self.PARTS:
            cls = getattr(importlib.import_module(module), cls_name, None)
            if cls is not None and method in cls.__dict__:  # another tree may lack one
                self._wrap(cls, method, label)
        from rlm_mcp.store.runs import RunLog

        self._wrap(RunLog, "append", lambda args: f"log append: {args[0].type}")

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._undo):
            setattr(cls, name, original)

    def report(self, turns: int) -> str:
        return "\n".join(
            f"  {key}: {self.spent[key] / turns * 1e6:.0f} µs per turn ({self.calls[key] / turns:g} calls per turn)"
            for key in sorted(self.spent)
        )


async def bench(runs: int, turns: int, profile: str | None, phases: _Phases | None = None) -> None:
    per_run: list[float] = []  # CPU seconds per further turn, one figure per run
    spent: list[float] = []
    rounds = [0, 0]  # event-loop rounds while a timed turn ran, and the timed turns
    prof = cProfile.Profile(time.thread_time) if profile else None
    timing = False  # off during the warm-up run
    original = TurnRunner.turn

    async def timed_turn(self: TurnRunner, iteration: int, turn_text: str) -> Any:
        if not timing or self.ctx.depth or not 2 <= iteration < turns:
            return await original(self, iteration, turn_text)
        if prof:
            prof.enable()
        if phases:
            phases.on = True
        started, first_round = time.thread_time(), counter.rounds
        try:
            return await original(self, iteration, turn_text)
        finally:
            spent.append(time.thread_time() - started)
            rounds[0] += counter.rounds - first_round
            rounds[1] += 1
            if phases:
                phases.on = False
            if prof:
                prof.disable()

    TurnRunner.turn = timed_turn  # type: ignore[method-assign]
    counter = _RoundCounter(asyncio.get_running_loop())
    load_before = _load()
    async with service_for(turns) as service:
        local = Caller(service, LOCAL_OWNER)
        context = await local.load_context(text=("0123456789abcdef" * 4 + "\n") * (1 << 14))

        async def one_run() -> None:
            await anyio.sleep(GAP_S)
            result = await local.complete(f"turns: {turns}", context.context_id, RunOverrides(), _quiet)
            assert result.status == "completed" and result.iterations == turns, result

        await one_run()  # warm-up: pool, connections, model discovered
        timing = True
        for _ in range(runs):
            spent.clear()
            await one_run()
            per_run.append(sum(spent) / len(spent))
    TurnRunner.turn = original  # type: ignore[method-assign]
    counter.close()
    print(
        f"event-loop thread CPU per further turn: median {statistics.median(per_run) * 1e6:.0f} µs "
        f"[{min(per_run) * 1e6:.0f}, {max(per_run) * 1e6:.0f}], event-loop rounds per turn "
        f"{rounds[0] / max(rounds[1], 1):.2f}; over {runs} runs of {turns} turns "
        f"(turns 2-{turns - 1} of each); rlm_mcp from {Path(sys.modules['rlm_mcp'].__file__ or '').parent}; "
        f"load average {load_before} at the start, {_load()} at the end"
    )
    if phases:
        phases.uninstall()
        print(f"event-loop thread CPU inside the turn's parts (turns 2-{turns - 1}):")
        print(phases.report(rounds[1]))
    if prof:
        prof.dump_stats(f"{profile}.turns")
        print(f"profile: {profile}.turns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--profile", metavar="PREFIX", help="also write thread-CPU cProfile data")
    parser.add_argument("--phases", action="store_true", help="also print the thread CPU inside the turn's parts")
    args = parser.parse_args()
    if args.turns < 3:
        parser.error("--turns must be at least 3 (turns 2 to N-1 are timed)")
    tune_for_serving()  # as `rlm-mcp serve` does: this process stands for a server
    phases = _Phases() if args.phases else None
    if phases:
        phases.install()
    anyio.run(bench, args.runs, args.turns, args.profile, phases)


if __name__ == "__main__":
    main()
