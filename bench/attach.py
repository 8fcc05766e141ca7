"""The attach stream's two readers side by side, in one run: the event-loop reader (a plain
socket, the default) against the thread reader (what a TLS or SSH DOCKER_HOST gets).

    .venv/bin/python bench/attach.py [--reps 5] [--cells 200] [--batches 100] [--record]

Each rep opens one sandbox per reader (alternating, a fresh container each, zero-latency
bridge) and times, in this process: a trivial cell's round trip (exec -> exec_result) and a
16-way `llm_query_batched` cell (exec, lm_request, lm_result, exec_result). Per item: wall time and
this process's CPU time (/proc, all threads: what the host pays for the frames). The ratio
loop/thread is taken per rep and the median printed with the load average at the start and the
end. `--record` writes bench/results/attach.json. Needs Docker and the sandbox image. Never fails
on a timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_file import ResultFile  # bench/ is on sys.path: this script's own folder

from rlm_mcp.config import Settings
from rlm_mcp.ports import LMRequest
from rlm_mcp.sandbox.docker import attach, container
from rlm_mcp.sandbox.manager import SandboxManager

RECORD = ResultFile("attach", "The attach stream's readers", ["what", "loop reader", "thread reader", "loop / thread"])
READERS = ("loop", "thread")


async def zero_bridge(request: LMRequest) -> list[str]:
    return ["ok"] * len(request.prompts)


@contextmanager
def reader(kind: str) -> Iterator[None]:
    """Containers started inside read their stream by `kind` (the thread: as if not a plain socket)."""
    if kind == "loop":
        yield
        return
    saved = attach.plain_socket
    rule = "plain_socket"  # the one rule (attach.py), as container.py imported it too

    def never(raw: Any) -> None:
        return None

    for module in (attach, container):
        setattr(module, rule, never)
    try:
        yield
    finally:
        for module in (attach, container):
            setattr(module, rule, saved)


async def measure(mgr: SandboxManager, kind: str, cells: int, batches: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU) per trivial cell and per 16-way batch cell, in ms, with `kind`'s reader."""
    with reader(kind):
        async with mgr.open([]) as sb:
            expected = attach.LoopReader if kind == "loop" else attach.ThreadReader
            channel = sb.container
            assert isinstance(channel, container.KernelContainer) and isinstance(channel._reader, expected), channel
            for _ in range(10):
                await sb.execute("x = 1", zero_bridge)
            out: dict[str, tuple[float, float]] = {}
            for name, code, n in (
                ("trivial cell", "x = 1", cells),
                ("16-way batch cell", "llm_query_batched(['p'] * 16)", batches),
            ):
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(n):
                    await sb.execute(code, zero_bridge)
                out[name] = (
                    (time.perf_counter() - wall) * 1000 / n,
                    (time.process_time() - cpu) * 1000 / n,
                )
            return out


async def main(reps: int, cells: int, batches: int, record: bool) -> None:
    load0 = os.getloadavg()
    settings = Settings(pool_size=0, cell_timeout_s=60)
    rows: dict[str, dict[str, list[float]]] = {}
    async with SandboxManager(settings.sandbox) as mgr:
        for rep in range(reps):
            order = READERS if rep % 2 == 0 else READERS[::-1]
            got = {kind: await measure(mgr, kind, cells, batches) for kind in order}
            for name in got["loop"]:
                for i, unit in enumerate(("wall", "CPU")):
                    row = rows.setdefault(f"{name}, {unit} (ms)", {"loop": [], "thread": [], "ratio": []})
                    loop, thread = got["loop"][name][i], got["thread"][name][i]
                    row["loop"].append(loop)
                    row["thread"].append(thread)
                    row["ratio"].append(loop / thread)
    load1 = os.getloadavg()
    print(f"reps {reps}, {cells} trivial cells and {batches} 16-way batch cells per reader per rep")
    print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    for what, row in rows.items():
        loop, thread, ratio = (statistics.median(row[k]) for k in ("loop", "thread", "ratio"))
        span = f"{min(row['ratio']):.2f}-{max(row['ratio']):.2f}"
        print(f"{what:34s} loop {loop:7.3f}  thread {thread:7.3f}  loop/thread {ratio:.3f} ({span})")
        RECORD.add(what, f"{loop:.3f}", f"{thread:.3f}", f"{ratio:.3f} ({span})")
    RECORD.note = f"median of {reps} reps; load average {load0[0]:.2f} at start, {load1[0]:.2f} at end"
    if record:
        print(f"wrote {RECORD.write()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--record", action="store_true", help="write bench/results/attach.json")
    args = parser.parse_args()
    anyio.run(main, args.reps, args.cells, args.batches, args.record)
