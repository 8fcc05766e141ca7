"""The attach stream's two readers side by side, in one run: the event-loop reader (a plain
socket, the default) against the thread reader (what a TLS or SSH DOCKER_HOST gets, and what every
stream got before), small frames written straight from the loop on both sides; and, third, the
fast channel (the frames over a unix socket shared with the container: sandbox/docker/fastchan.py),
read by the event-loop reader too.

    .venv/bin/python bench/attach.py [--reps 21] [--cells 50] [--batches 25] [--record]

One sandbox per reader, both open throughout (zero-latency bridge); each rep times, alternating
which goes first, in this process: a trivial cell's round trip (exec -> exec_result) and a
16-way `llm_query_batched` cell (exec, lm_request, lm_result, exec_result). Per item: wall time and
this process's CPU time (/proc, all threads: what the host pays for the frames). The ratio
loop/thread (and socket/loop) is taken per rep and the median printed with the load average at the start and the
end. `--record` writes bench/results/attach.json. Needs Docker and the sandbox image. Never fails
on a timing.
"""

from __future__ import annotations

import argparse
import contextlib
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
from rlm_mcp.ports import LMRequest, Sandbox
from rlm_mcp.sandbox.docker import attach
from rlm_mcp.sandbox.docker.container import KernelContainer
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.sandbox.session import KernelSandbox

RECORD = ResultFile(
    "attach",
    "The attach stream's readers and the fast channel",
    ["what", "loop reader", "thread reader", "loop / thread", "fast channel", "fast / loop"],
)
READERS = ("loop", "thread", "socket")


async def zero_bridge(request: LMRequest) -> list[str]:
    return ["ok"] * len(request.prompts)


@contextmanager
def channel(kind: str, mgr: SandboxManager) -> Iterator[None]:
    """Containers started inside use the fast channel for "socket" only, the attach stream else."""
    channels = getattr(mgr.backend, "channels", None)
    assert channels is not None, "the Docker backend has no fast channel"
    saved = channels.off_reason
    if kind != "socket":
        channels.off_reason = "bench: the attach stream"
    try:
        with reader(kind):
            yield
    finally:
        channels.off_reason = saved


@contextmanager
def reader(kind: str) -> Iterator[None]:
    """Containers started inside read their stream by `kind`. The thread: `open_reader` is told the
    socket is not plain; the writes still go straight from the loop (container.py keeps its own
    reference to the rule), so the thread side is the reader as it was before the loop reader."""
    if kind != "thread":
        yield
        return
    saved = attach.plain_socket
    rule = "plain_socket"

    def never(raw: Any) -> None:
        return None

    setattr(attach, rule, never)
    try:
        yield
    finally:
        setattr(attach, rule, saved)


async def measure(sb: Sandbox, cells: int, batches: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU) per trivial cell and per 16-way batch cell, in ms."""
    out: dict[str, tuple[float, float]] = {}
    for name, code, n in (
        ("trivial cell", "x = 1", cells),
        ("16-way batch cell", "llm_query_batched(['p'] * 16)", batches),
    ):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            await sb.execute(code, zero_bridge)
        out[name] = ((time.perf_counter() - wall) * 1000 / n, (time.process_time() - cpu) * 1000 / n)
    return out


async def main(reps: int, cells: int, batches: int, record: bool) -> None:
    load0 = os.getloadavg()
    settings = Settings(pool_size=0, cell_timeout_s=60)
    rows: dict[str, dict[str, list[float]]] = {}
    async with SandboxManager(settings.sandbox) as mgr, contextlib.AsyncExitStack() as stack:
        boxes: dict[str, Sandbox] = {}
        for kind in READERS:
            with channel(kind, mgr):  # the reader and the channel are chosen when the container starts
                sb = boxes[kind] = await stack.enter_async_context(mgr.open([]))
            assert isinstance(sb, KernelSandbox), sb
            container = sb.container
            expected = attach.ThreadReader if kind == "thread" else attach.LoopReader
            assert isinstance(container, KernelContainer) and isinstance(container._reader, expected), container
            assert container._plain is not None  # small frames are written from the loop on both sides
            assert container.channel == ("socket" if kind == "socket" else "attach"), container.channel
            for _ in range(20):
                await sb.execute("x = 1", zero_bridge)
        for rep in range(reps):
            order = READERS if rep % 2 == 0 else READERS[::-1]
            got = {kind: await measure(boxes[kind], cells, batches) for kind in order}
            for name in got["loop"]:
                for i, unit in enumerate(("wall", "CPU")):
                    keys = ("loop", "thread", "ratio", "socket", "fast_ratio")
                    row = rows.setdefault(f"{name}, {unit} (ms)", {k: [] for k in keys})
                    loop, thread, sock = (got[kind][name][i] for kind in READERS)
                    row["loop"].append(loop)
                    row["thread"].append(thread)
                    row["ratio"].append(loop / thread)
                    row["socket"].append(sock)
                    row["fast_ratio"].append(sock / loop)
    load1 = os.getloadavg()
    print(f"reps {reps}, {cells} trivial cells and {batches} 16-way batch cells per reader per rep")
    print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    for what, row in rows.items():
        loop, thread, ratio, sock, fast = (
            statistics.median(row[k]) for k in ("loop", "thread", "ratio", "socket", "fast_ratio")
        )
        span = f"{min(row['ratio']):.2f}-{max(row['ratio']):.2f}"
        fast_span = f"{min(row['fast_ratio']):.2f}-{max(row['fast_ratio']):.2f}"
        print(
            f"{what:34s} loop {loop:7.3f}  thread {thread:7.3f}  loop/thread {ratio:.3f} ({span})"
            f"  socket {sock:7.3f}  socket/loop {fast:.3f} ({fast_span})"
        )
        RECORD.add(
            what, f"{loop:.3f}", f"{thread:.3f}", f"{ratio:.3f} ({span})", f"{sock:.3f}", f"{fast:.3f} ({fast_span})"
        )
    RECORD.note = f"median of {reps} reps; load average {load0[0]:.2f} at start, {load1[0]:.2f} at end"
    if record:
        print(f"wrote {RECORD.write()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--batches", type=int, default=25)
    parser.add_argument("--record", action="store_true", help="write bench/results/attach.json")
    args = parser.parse_args()
    anyio.run(main, args.reps, args.cells, args.batches, args.record)
