"""Counts an asyncio loop's callbacks by what they resume (`bench/team_perrun.py --loop-callbacks`).

Loaded by a server process whose PYTHONPATH starts with this folder (Python imports a
`sitecustomize` at start): every `Handle._run` is counted under the callback's name, or for a
task's step, the task's coroutine and the innermost awaits it is resumed at. SIGUSR2 clears the
counts, SIGUSR1 writes them to $RLM_BENCH_LOOP_HOOK_DIR/PID.txt (most first);
$RLM_BENCH_LOOP_HOOK_DEPTH: how many of a task's innermost awaits name its step (3). A measuring aid
only: it slows the loop, so a run with it has no valid CPU figures.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import collections
import os
import signal
from typing import Any

_counts: collections.Counter[str] = collections.Counter()
_DEPTH = int(os.environ.get("RLM_BENCH_LOOP_HOOK_DEPTH", "3"))  # the innermost awaits named
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
        _counts[_where(self._callback)] += 1  # type: ignore[attr-defined]  # Handle's own field
    except Exception:  # a callback this cannot name: counted all the same
        _counts["?"] += 1
    _run(self)


def _write(*_: object) -> None:
    folder = os.environ.get("RLM_BENCH_LOOP_HOOK_DIR", "/tmp")
    with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as out:
        out.write(f"{sum(_counts.values())} total\n")
        for what, n in _counts.most_common(100):
            out.write(f"{n} {what}\n")


def _clear(*_: object) -> None:
    _counts.clear()


if os.environ.get("RLM_BENCH_LOOP_HOOK_DIR"):
    asyncio.events.Handle._run = _counted_run  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _write)
    signal.signal(signal.SIGUSR2, _clear)
