"""Where a 16-way batch's CPU goes across the processes of `bench/subcall.py`'s setup, floor
against rlm-mcp, and how the scheduler placed them.

    .venv/bin/python bench/subcall_procs.py [--n 16] [--batches 8] [--reps 4] [--pin-lm] [--no-settle]

The service, script and scripted server of bench/subcall.py. Each rep runs the floor's batches of
`--n` bare requests, then an rlm-mcp run whose cell makes `--batches` batches, each after a 1.5 s
pause (the warm pool's refill out of the way; `--no-settle`: the floor right after the previous
run, as bench/subcall.py orders them). What is read is the CPU (schedstat, ns) of: this process's
event-loop thread, its other threads, the scripted LM, every process under a containerd shim (the
sandbox's kernel; other users' containers too) and Docker's daemons; and the scheduler's counts
of the event-loop thread and the scripted LM (switches voluntary and not, migrations between
CPUs). rlm-mcp's span runs from the bridge's start of the second batch to the last's (`--batches`
- 2 whole cycles: the bridge, the answer frame, the cell's loop, the next request frame, its
dispatch; the run's own start and end outside), the floor's over as many batches after a first
one; both per batch. The reads cost milliseconds of the loop thread (the /proc files of every
container's threads): the loop's own CPU is read last at a span's start and first at its end.
Never fails on a timing.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.run's service
from bench.procfs import process_groups, task_cpu_ns
from bench.run import bench_service
from bench.subcall import (
    _load,
    _pin_scripted_lm,
    _quiet,
    batch_parser,
    cell_times,
    floor_batches,
    many_and_one,
    sub_call_limit,
)
from rlm_mcp.cli.collector import tune_for_serving
from rlm_mcp.engine.bridge import SubCallBridge
from rlm_mcp.lm.http import HttpPool
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides

COUNTS = ("nr_voluntary_switches", "nr_involuntary_switches", "se.nr_migrations")


def _sched(pid: int, tid: int | None = None) -> dict[str, float]:
    path = f"/proc/{pid}/task/{tid}/sched" if tid is not None else f"/proc/{pid}/sched"
    out: dict[str, float] = {}
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in COUNTS:
                out[name.strip()] = float(value)
    except OSError:
        pass
    return out


def _thread_ns(pid: int, tid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    except (OSError, ValueError):
        return 0


def _lm_pid() -> int:
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            if b"rlm_mcp.testing.scripted_lm" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    raise SystemExit("no scripted LM process found")


class Snap:
    """The processes' counters; `groups()` finds the containers' and daemons' processes (a scan
    of /proc, done outside the timed spans), `take()` reads them (the loop thread's own CPU
    read last, so the reads themselves fall outside the span that starts there)."""

    def __init__(self, lm: int) -> None:
        self.me = os.getpid()
        self.loop_tid = threading.get_native_id()
        self.lm = lm
        self.found: dict[str, list[int]] = {}

    def groups(self) -> None:
        self.found = process_groups(self.me, self.lm)

    def take(self, *, end: bool = False) -> dict[str, float]:
        """The counters; at a span's `end` the loop thread's CPU is read first, at its start
        last, so that the reads (milliseconds of this thread) fall outside the span."""
        first = _thread_ns(self.me, self.loop_tid) if end else 0
        whole = task_cpu_ns(self.me) if end else 0
        out = {
            "server: other threads": float(whole or task_cpu_ns(self.me)),
            "scripted LM": task_cpu_ns(self.lm),
            "containers (the sandbox's kernel)": sum(
                task_cpu_ns(p) for p in self.found["every container (others' too)"]
            ),
            "dockerd + containerd": sum(task_cpu_ns(p) for p in self.found["dockerd + containerd"]),
        }
        for key, value in _sched(self.lm).items():
            out[f"scripted LM {key}"] = value
        for key, value in _sched(self.me, self.loop_tid).items():
            out[f"loop thread {key}"] = value
        loop = first if end else _thread_ns(self.me, self.loop_tid)
        out["server: other threads"] -= loop
        out["server: event-loop thread"] = loop
        return out


def _diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


async def bench(n: int, batches: int, reps: int, pin_lm: bool, settle: bool) -> None:
    load_before = _load()
    script = many_and_one(n, batches)
    sides: dict[str, list[dict[str, float]]] = {"floor": [], "rlm-mcp": []}
    walls: dict[str, list[float]] = {"floor": [], "rlm-mcp": []}
    marks: list[tuple[dict[str, float], float]] = []  # at the bridge's start of each batch
    async with bench_service(
        script, max_concurrent_lm_calls=max(n, 16), max_sub_calls_per_run=sub_call_limit(n, batches)
    ) as service:
        url: str = service.lm.settings.base_url
        if pin_lm:
            _pin_scripted_lm()
        snap = Snap(_lm_pid())
        local = Caller(service, LOCAL_OWNER)
        context = await local.load_context(text="hello " * 1000)
        original = SubCallBridge.__call__

        async def marked(self: SubCallBridge, request: Any) -> list[str]:
            # Read at the second batch's start and the last's only (a read is milliseconds of
            # this thread: /proc files of every container's threads).
            if not marks:
                snap.groups()  # the run's container is up: found once, before the first mark
            at = time.perf_counter()
            taken = snap.take(end=len(marks) == batches - 1) if len(marks) in (1, batches - 1) else {}
            marks.append((taken, time.perf_counter() if len(marks) == 1 else at))
            return await original(self, request)

        SubCallBridge.__call__ = marked  # type: ignore[method-assign]

        async def run() -> None:
            await anyio.sleep(1.5)  # the warm pool refills only while no sandbox is in use
            marks.clear()
            result = await local.complete("many: go", context.context_id, RunOverrides(), _quiet)
            assert result.status == "completed", result
            cell_times(result.answer)  # every sub-call answered

        pool = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=False)
        try:
            await floor_batches(url, n, 1, pool)
            await run()
            for _ in range(reps):
                if settle:  # as before rlm-mcp's run: the pool's refill out of the way
                    await anyio.sleep(1.5)
                snap.groups()
                await floor_batches(url, n, 1, pool)
                before, started = snap.take(), time.perf_counter()
                await floor_batches(url, n, batches - 2, pool)
                wall = time.perf_counter() - started
                sides["floor"].append({k: v / (batches - 2) for k, v in _diff(before, snap.take(end=True)).items()})
                walls["floor"].append(wall / (batches - 2))
                await run()
                # From the second batch's start to the last's: batches - 2 whole cycles (the
                # bridge, the answer frame, the cell's loop, the next request frame, dispatch).
                (first, t0), (last, t1) = marks[1], marks[-1]
                sides["rlm-mcp"].append({k: v / (batches - 2) for k, v in _diff(first, last).items()})
                walls["rlm-mcp"].append((t1 - t0) / (batches - 2))
                print("rep done", file=sys.stderr)
        finally:
            SubCallBridge.__call__ = original  # type: ignore[method-assign]
            await pool.aclose()
    print(f"{n}-way, per batch (batches 2 to {batches}: {batches - 2} whole cycles each side); medians of {reps} reps")
    print(f"{'':44}{'floor':>12}{'rlm-mcp':>12}")
    for key in sides["floor"][0]:
        f = statistics.median(s[key] for s in sides["floor"])
        m = statistics.median(s[key] for s in sides["rlm-mcp"])
        if "switches" in key or "migrations" in key:
            print(f"{key:<44}{f:>12.1f}{m:>12.1f}")
        else:
            print(f"{key + ' µs':<44}{f / 1000:>12.0f}{m / 1000:>12.0f}")
    f, m = statistics.median(walls["floor"]), statistics.median(walls["rlm-mcp"])
    print(f"{'wall per batch µs':<44}{f * 1e6:>12.0f}{m * 1e6:>12.0f}")
    print(f"load average {load_before} at the start, {_load()} at the end")


def main() -> None:
    parser = batch_parser(__doc__)
    parser.add_argument("--pin-lm", action="store_true")
    parser.add_argument(
        "--no-settle",
        action="store_true",
        help="the floor right after rlm-mcp's run, as bench/subcall.py orders them (its sandbox's replacement starting)",
    )
    args = parser.parse_args()
    tune_for_serving()
    anyio.run(bench, args.n, args.batches, args.reps, args.pin_lm, not args.no_settle)


if __name__ == "__main__":
    main()
