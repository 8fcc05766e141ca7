"""A big sub-call batch's start: how long after the bridge takes a batch its first request
reaches the LM, against the same for a batch of one, in one run.

    .venv/bin/python bench/fanout.py [--reps 5] [--size 200] [--concurrency 16] [--slots 64]
        [--sub-delay 0.2] [--record]

The bridge (rlm_mcp.engine.bridge, what answers a cell's `llm_query_batched` frame) with the
real LM client, in process, against the scripted LM in a subprocess that serves
`--concurrency` requests at once, `--sub-delay` s each, and logs when each request arrived
(epoch seconds; the same clock as this process). Per rep, alternating: a batch of one (the
floor: the same path with nothing else to prepare) and a batch of `--size`. Reported: the
first request's arrival after the bridge was called (median [min, max] over reps) for both,
their ratio per rep, and the big batch's wall ÷ its ideal (ceil(size / concurrency) rounds of
the scripted delay). `--slots` is RLM_MCP_MAX_CONCURRENT_LM_CALLS (bench/lm_time.py runs 64
against the server's 16). `--record` writes bench/results/fanout.json. Never fails on a timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench's own modules
from bench.results_file import ResultFile
from rlm_mcp.config import Settings
from rlm_mcp.engine.bridge import make_bridge
from rlm_mcp.engine.tree import RunTree
from rlm_mcp.engine.turn import RunContext
from rlm_mcp.engine.types import RunProgress
from rlm_mcp.events import RunEvent
from rlm_mcp.lm.client import LMClient
from rlm_mcp.ports import LMRequest
from rlm_mcp.ports.run_values import RunLimits
from rlm_mcp.testing import scripted_lm_process

RUN = "bench-fanout"


async def _no_child(prompt: str, depth: int) -> str:
    raise AssertionError("no child runs here")


async def _drop(event: RunEvent) -> None:
    return None


async def one_batch(settings: Settings, lm: LMClient, log: Path, size: int) -> tuple[float, float]:
    """Seconds from calling the bridge to the first request's arrival, and the batch's wall."""
    limits = RunLimits(max_iterations=5, max_depth=1, timeout_s=600, token_budget=None, max_errors=3)
    progress = RunProgress(run_id=RUN, max_iterations=5)
    tree = RunTree(
        progress=progress,
        limits=limits,
        deadline=anyio.current_time() + 600,
        sink=_drop,
        max_sub_calls=size,
        max_prompts_per_batch=size,
        max_concurrent_children=1,
    )
    ctx = RunContext(settings=settings.engine, lm=lm, tree=tree, depth=0, run_id=RUN, progress=progress, limits=limits)
    bridge = make_bridge(ctx, run_child=_no_child)
    await anyio.Path(log).write_text("")
    await anyio.sleep(0.3)  # the previous batch's connections settle
    started = time.time()
    answers = await bridge(LMRequest(kind="llm", prompts=[f"q{i}" for i in range(size)], model=None))
    wall = time.time() - started
    assert answers == ["ok"] * size, answers[:3]
    arrivals = [json.loads(line)["received"] for line in (await anyio.Path(log).read_text()).splitlines()]
    return min(arrivals) - started, wall


async def bench(args: argparse.Namespace) -> None:
    loads = [os.getloadavg()]
    script = {
        "sub_default": "ok",
        "max_model_len": 65536,
        "delay_s": {"sub": args.sub_delay},
        "max_concurrency": args.concurrency,
    }
    ideal = math.ceil(args.size / args.concurrency) * args.sub_delay
    one: list[float] = []
    big: list[float] = []
    ratio: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rlm-fanout-") as tmp_name:
        tmp = Path(tmp_name)
        log = tmp / "requests.jsonl"
        with scripted_lm_process(script, log_path=log) as url:
            settings = Settings(
                _env_file=None,
                base_url=url,
                data_dir=tmp / "data",
                allowed_roots=[tmp],
                max_concurrent_lm_calls=args.slots,
            )
            async with LMClient(settings.lm) as lm:
                await one_batch(settings, lm, log, args.size)  # warm-up: connections, the window
                for rep in range(args.reps):
                    one.append((await one_batch(settings, lm, log, 1))[0])
                    first, wall = await one_batch(settings, lm, log, args.size)
                    big.append(first)
                    ratio.append(wall / ideal)
                    print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    loads.append(os.getloadavg())
    load = " -> ".join("/".join(f"{x:.1f}" for x in la) for la in loads)

    def cell(values: list[float], scale: float, unit: str) -> str:
        scaled = [v * scale for v in values]
        return f"{statistics.median(scaled):.2f} [{min(scaled):.2f}, {max(scaled):.2f}]{unit}"

    firsts = [b / o for b, o in zip(big, one, strict=True)]
    out = ResultFile(
        "fanout",
        f"A {args.size}-way batch's first request: its arrival after the bridge took the batch, beside a batch of one",
        ["batch", "first request after the bridge (one)", f"same ({args.size})", "ratio", "batch wall / ideal"],
        note=(
            f"{args.reps} reps, batches of one and of {args.size} alternating; scripted LM {args.sub_delay} s per "
            f"sub-call, {args.concurrency} served at once; {args.slots} LM slots; median [min, max]; "
            f"load average (1, 5, 15 min) {load}"
        ),
    )
    row = (
        f"{args.size}-way",
        cell(one, 1000, " ms"),
        cell(big, 1000, " ms"),
        cell(firsts, 1, "×"),
        cell(ratio, 1, ""),
    )
    out.add(*row)
    print("  ".join(out.columns))
    print("  ".join(row))
    print(f"load average (1, 5, 15 min) {load}")
    if args.record:
        print(f"written: {out.write()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16, help="requests the LM serves at once")
    parser.add_argument("--slots", type=int, default=64, help="RLM_MCP_MAX_CONCURRENT_LM_CALLS")
    parser.add_argument("--sub-delay", type=float, default=0.2, help="seconds per sub-call (default 0.2)")
    parser.add_argument("--record", action="store_true", help="write bench/results/fanout.json")
    anyio.run(bench, parser.parse_args())


if __name__ == "__main__":
    main()
