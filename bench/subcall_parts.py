"""Where a sub-call's host CPU goes in `bench/subcall.py`'s setup: the run's fixed cost, each
batch's, and each call's, split into the parts of the server process that carry them.

    .venv/bin/python bench/subcall_parts.py [--n 16] [--batches 8] [--reps 4]

The service, script and scripted server of bench/subcall.py (a real Docker sandbox, the
zero-latency scripted LM in a subprocess, a run log written). Two cells alternate: one times
`--batches` batches of `--n` prompts, one a single batch. What is measured is the event loop
thread's CPU (`time.thread_time`):

- around each whole run (`Caller.complete`): its process CPU too (`time.process_time`), the
  figure bench/subcall.py divides by the run's sub-calls. The two cells' difference gives the
  CPU each further call adds (the marginal) and what a run costs besides (the fixed part: the
  root call, the cell, the run's start and end, its first batch's fixed cost);
- around parts of the runs with `--batches` batches (their sum over the timed runs, per
  sub-call): the bridge's handling of each batch (`SubCallBridge.__call__`: every call's LM
  client and HTTP, usage, metrics and events, and whatever else the thread ran meanwhile), the
  `llm_call` events (`RunTree.emit_call`: built, encoded, written; of which their log line and
  its write, `RunLog.append` or `append_call`) and the other events (`RunTree.emit`), each frame read (the reader's callback: recv, split, decode, hand-over),
  each frame written (`KernelContainer.send`: encoded, written) and each request's dispatch
  (`KernelSandbox._on_lm_request`: the gate, the answering task's start).

Wrapping a function costs two clock reads per call; parts nest (the events are inside the
bridge). Other processes (the scripted LM, the sandbox, Docker) are not counted: on a loaded
2-core machine they share the cores, and wall times follow them. Never fails on a timing.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.run's service
from bench.run import bench_service
from bench.subcall import _load, _quiet, batch_parser, cell_times, many_and_one, sub_call_limit
from rlm_mcp.cli.collector import tune_for_serving
from rlm_mcp.engine.bridge import SubCallBridge
from rlm_mcp.engine.tree import RunTree
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.sandbox.docker.attach import LoopReader
from rlm_mcp.sandbox.docker.container import KernelContainer
from rlm_mcp.sandbox.session import KernelSandbox
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.store.runs import RunLog

spent: dict[str, float] = defaultdict(float)  # thread CPU seconds per part, while `timing`
calls: dict[str, int] = defaultdict(int)
timing = [False]


def _timed_sync(owner: Any, name: str, label: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if not timing[0]:
            return original(*args, **kwargs)
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - started
            calls[label] += 1

    setattr(owner, name, timed)


def _timed_async(owner: Any, name: str, label: Callable[..., str] | str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        if not timing[0]:
            return await original(*args, **kwargs)
        part = label if isinstance(label, str) else label(*args, **kwargs)
        started = time.thread_time()
        try:
            return await original(*args, **kwargs)
        finally:
            spent[part] += time.thread_time() - started
            calls[part] += 1

    setattr(owner, name, timed)


def _event_part(tree: RunTree, event: Any) -> str:
    return "llm_call event via emit" if event.type == "llm_call" else PARTS[3]


def _line_part(log: RunLog, event: Any) -> str:
    return PARTS[2] if event.type == "llm_call" else "other events' log lines"


PARTS = (
    "bridge (a batch's calls)",
    "llm_call events",
    "  of which their log line (RunLog)",
    "other events",
    "frames read",
    "frames written",
    "request dispatch",
)


def _wrap() -> None:
    _timed_async(SubCallBridge, "__call__", PARTS[0])
    _timed_async(RunTree, "emit_call", PARTS[1])
    _timed_async(RunTree, "emit", _event_part)
    _timed_async(RunLog, "append", _line_part)
    if hasattr(RunLog, "append_call"):  # a tree whose runs take LM calls' events as lines
        _timed_async(RunLog, "append_call", PARTS[2])
    _timed_sync(LoopReader, "_on_readable", PARTS[4])
    _timed_async(KernelContainer, "send", PARTS[5])
    _timed_async(KernelSandbox, "_on_lm_request", PARTS[6])


async def bench(n: int, batches: int, reps: int) -> None:
    load_before = _load()
    script = many_and_one(n, batches)
    runs: dict[str, list[tuple[float, float]]] = {"many": [], "one": []}  # (thread, process) CPU
    async with bench_service(
        script, max_concurrent_lm_calls=max(n, 16), max_sub_calls_per_run=sub_call_limit(n, batches)
    ) as service:
        local = Caller(service, LOCAL_OWNER)
        context = await local.load_context(text="hello " * 1000)

        async def run(kind: str, parts: bool) -> None:
            await anyio.sleep(1.5)  # the warm pool refills only while no sandbox is in use
            timing[0] = parts
            thread0, process0 = time.thread_time(), time.process_time()
            result = await local.complete(f"{kind}: go", context.context_id, RunOverrides(), _quiet)
            runs[kind].append((time.thread_time() - thread0, time.process_time() - process0))
            timing[0] = False
            assert result.status == "completed", result
            cell_times(result.answer)  # every sub-call answered

        await run("many", False)  # warm-up: connections, the model's window, the pool
        await run("one", False)
        runs["many"].clear()
        runs["one"].clear()
        for _ in range(reps):
            await run("many", True)
            await run("one", False)
    per_run = n * batches
    timed_calls = per_run * reps
    many = [statistics.median(c[i] for c in runs["many"]) for i in (0, 1)]
    one = [statistics.median(c[i] for c in runs["one"]) for i in (0, 1)]
    marginal = [(m - o) / (n * (batches - 1)) for m, o in zip(many, one, strict=True)]
    fixed = [o - mc * n for o, mc in zip(one, marginal, strict=True)]
    print(f"{n}-way, {batches} batches a run, {reps} runs of each cell (medians); µs of CPU per sub-call")
    print(
        f"  run of {batches} batches, whole: thread {many[0] / per_run * 1e6:.0f}, process {many[1] / per_run * 1e6:.0f}"
    )
    print(f"  marginal (each further call): thread {marginal[0] * 1e6:.0f}, process {marginal[1] * 1e6:.0f}")
    print(f"  fixed per run: thread {fixed[0] * 1e3:.2f} ms, process {fixed[1] * 1e3:.2f} ms")
    print("  parts of the runs of many batches (thread CPU, nested: the events are in the bridge):")
    for part in PARTS:
        each = spent[part] / calls[part] * 1e6 if calls[part] else 0.0
        print(
            f"    {part:<26} {spent[part] / timed_calls * 1e6:7.1f} per sub-call  ({calls[part]} calls, {each:.1f} each)"
        )
    print(f"load average {load_before} at the start, {_load()} at the end")


def main() -> None:
    parser = batch_parser(__doc__)
    args = parser.parse_args()
    if args.batches < 2:
        parser.error("--batches must be 2 or more (the marginal is the difference with one batch)")
    _wrap()
    tune_for_serving()  # as bench/subcall.py does: this process stands for a server
    anyio.run(bench, args.n, args.batches, args.reps)


if __name__ == "__main__":
    main()
