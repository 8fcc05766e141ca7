"""Counts an asyncio loop's callbacks by what they resume (`bench/team_perrun.py --loop-callbacks`).

Loaded by a server process whose PYTHONPATH starts with this folder (Python imports a
`sitecustomize` at start): every `Handle._run` is counted under the callback's name, or for a
task's step, the task's coroutine and the innermost awaits it is resumed at. SIGUSR2 clears the
counts, SIGUSR1 writes them to $RLM_BENCH_LOOP_HOOK_DIR/PID.txt (most first);
$RLM_BENCH_LOOP_HOOK_DEPTH: how many of a task's innermost awaits name its step (3);
$RLM_BENCH_LOOP_HOOK_TOP: how many of the most frequent are written (100);
$RLM_BENCH_LOOP_HOOK_CPU set: each callback's thread CPU time (`time.thread_time`) is summed by the
same name too, written to PID.cpu (valid at any load, as the thread's own CPU; the timing adds
~1 us a callback); $RLM_BENCH_LOOP_HOOK_PROFILE set: a cProfile of the main thread (the event
loop's) on the thread's CPU clock, from SIGUSR2 to SIGUSR1, written to PID.prof (read with
`pstats`; the profiler's own cost inflates every figure: compare shares, or two processes
profiled alike). A measuring aid
only: it slows the loop, so a run with it has no valid CPU figures.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import collections
import cProfile
import os
import signal
import time
from typing import Any

_counts: collections.Counter[str] = collections.Counter()
# The thread's CPU seconds in each, when timed.
_cpu: collections.defaultdict[str, float] = collections.defaultdict(float)
_TIMED = bool(os.environ.get("RLM_BENCH_LOOP_HOOK_CPU"))
_DEPTH = int(os.environ.get("RLM_BENCH_LOOP_HOOK_DEPTH", "3"))  # the innermost awaits named
_PROFILED = bool(os.environ.get("RLM_BENCH_LOOP_HOOK_PROFILE"))
_profile: cProfile.Profile | None = None
_run = asyncio.events.Handle._run


def _where(callback: Any) -> str:
    task = getattr(callback, "__self__", None)
    if not isinstance(task, asyncio.Task):
        return "cb " + (getattr(callback, "__qualname__", None) or type(callback).__name__)
    chain: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(chain) < 40:
        chain.append(getattr(awaited, "__qualname__", None) or type(awaited).__name__)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return f"task {chain[0]} @ " + " > ".join(chain[-_DEPTH:])


def _counted_run(self: asyncio.events.Handle) -> None:
    try:
        where = _where(self._callback)  # type: ignore[attr-defined]  # Handle's own field
    except Exception:  # a callback this cannot name: counted all the same
        where = "?"
    _counts[where] += 1
    if not _TIMED:
        _run(self)
        return
    started = time.thread_time()
    try:
        _run(self)
    finally:
        _cpu[where] += time.thread_time() - started


def _write(*_: object) -> None:
    folder = os.environ.get("RLM_BENCH_LOOP_HOOK_DIR", "/tmp")
    if _profile is not None:
        _profile.disable()
        _profile.dump_stats(os.path.join(folder, f"{os.getpid()}.prof"))
    with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as out:
        out.write(f"{sum(_counts.values())} total\n")
        for what, n in _counts.most_common(int(os.environ.get("RLM_BENCH_LOOP_HOOK_TOP", "100"))):
            out.write(f"{n} {what}\n")
    if _TIMED:
        with open(os.path.join(folder, f"{os.getpid()}.cpu"), "w") as out:
            out.write(f"{sum(_cpu.values()) * 1e6:.0f} total us\n")
            for what, seconds in sorted(_cpu.items(), key=lambda kv: -kv[1]):
                out.write(f"{seconds * 1e6:.0f} {what}\n")


def _clear(*_: object) -> None:
    global _profile
    _counts.clear()
    _cpu.clear()
    if _PROFILED:
        if _profile is not None:
            _profile.disable()
        _profile = cProfile.Profile(time.thread_time)
        _profile.enable()


if os.environ.get("RLM_BENCH_LOOP_HOOK_DIR"):
    asyncio.events.Handle._run = _counted_run  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _write)
    signal.signal(signal.SIGUSR2, _clear)
