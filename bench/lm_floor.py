"""The batch rows' floor: what a bare client's batches cost over the ideal on the scripted LM with
latency, on this machine now. bench/lm_time.py counts a batch of n sub-calls at concurrency c as
ceil(n / c) rounds of the scripted latency; the server's own work, the client library's and the
machine's scheduling are above that for any client. This measures them alone.

    .venv/bin/python bench/lm_floor.py [--reps 5] [--sub-delay 0.2] [--tokens-per-s 100] [--concurrency 16]

The same scripted server and latency as bench/lm_time.py (its defaults), and bare requests from
rlm-mcp's own HTTP pool (lm/http.py, the one its LM client uses: plain http to this loopback
server through lm/plain_http.py, on one keep-alive pool) in the shapes of its batch
rows: one round of 16 (a `batch_1m` turn; five of them in that row), and 200 prompts at 16 served
at once, 64 in flight (`fan_200`: rlm-mcp's LM limit there is 64). Prints each shape's wall over
its ideal, median [min, max] across reps, and the load average. Print only (no --record): the
batch rows of bench/lm_time.py are read against it in the same hour. Never fails on a timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rlm_mcp
from rlm_mcp.lm.http import HttpPool
from rlm_mcp.testing import Script, scripted_lm_process

SHAPES = (("16 prompts, 16 in flight (one batch_1m turn)", 16, 16), ("200 prompts, 64 in flight (fan_200)", 200, 64))


async def batch(pool: HttpPool, url: str, n: int, width: int) -> float:
    """Seconds of n bare requests, `width` tasks each taking the next prompt as its last ends."""
    prompts = iter(range(n))

    async def slot() -> None:
        for i in prompts:
            body = json.dumps({"model": "rlm-v0.1", "messages": [{"role": "user", "content": f"q{i}"}]}).encode()
            reply = await pool.request("POST", f"{url}/chat/completions", json_body=body)
            assert reply.status_code == 200, reply.status_code

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(min(n, width)):
            tg.start_soon(slot)
    return time.perf_counter() - started


async def bench(args: argparse.Namespace) -> None:
    script = Script(
        model="rlm-v0.1",
        max_model_len=65536,
        sub_default="ok",
        delay_s={"root": 0.5, "sub": args.sub_delay},
        tokens_per_s=args.tokens_per_s,
        max_concurrency=args.concurrency,
    )
    latency = script.scripted_latency_s("sub", "ok")
    load = os.getloadavg()[0]
    walls: dict[str, list[float]] = {name: [] for name, _, _ in SHAPES}
    with scripted_lm_process(script) as url:
        pool = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=False)  # as a loopback endpoint's
        try:
            for _, n, width in SHAPES:  # warm-up: the connections opened
                await batch(pool, url, n, width)
            for _ in range(args.reps):
                for name, n, width in SHAPES:
                    walls[name].append(await batch(pool, url, n, width))
        finally:
            await pool.aclose()
    print(f"scripted sub latency {latency:.3f} s, {args.concurrency} served at once; {args.reps} reps")
    for name, n, _ in SHAPES:
        ideal = math.ceil(n / args.concurrency) * latency
        ratios = [w / ideal for w in walls[name]]
        over = statistics.median(walls[name]) - ideal
        print(
            f"{name:<48} ideal {ideal:.2f} s  wall / ideal {statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}, {max(ratios):.3f}]  over {over * 1000:.0f} ms"
        )
    print(f"load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sub-delay", type=float, default=0.2)
    parser.add_argument("--tokens-per-s", type=float, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    anyio.run(bench, parser.parse_args())


if __name__ == "__main__":
    main()
