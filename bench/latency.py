"""Latency-bound efficiency: with an LM that takes a fixed time per call and serves calls
concurrently, how close is a run's wall time to the ideal?

    .venv/bin/python bench/latency.py [--delay 0.2] [--limit 16] [--repeat 3]

The ideal is the sum over sequential rounds of LM calls: each root turn is one round, and a
batch of n sub-calls is ceil(n / limit) rounds (limit = RLM_MCP_MAX_CONCURRENT_LM_CALLS).
The script: a 2*limit-prompt batch, a limit-prompt batch, one llm_query, then the answer:
4 root rounds + 2 + 1 + 1 sub rounds. Prints wall / ideal (target: within 5%, i.e. <= 1.05).
Never fails on a timing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import anyio

from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.run's service and runs
from bench.run import DONE, bench_service, timed_run


def batch(n: int) -> str:
    return f'```repl\nr = llm_query_batched(["q%d" % i for i in range({n})])\nprint(len(r))\n```'


async def bench(delay: float, limit: int, repeat: int) -> None:
    replies = [batch(2 * limit), batch(limit), '```repl\nprint(llm_query("one"))\n```', DONE]
    sub_rounds = math.ceil(2 * limit / limit) + 1 + 1
    ideal = (len(replies) + sub_rounds) * delay
    script = {"root": replies, "sub_default": "ok", "delay_s": delay, "max_model_len": 65536}
    async with bench_service(script, max_concurrent_lm_calls=limit) as service:
        local = Caller(service, LOCAL_OWNER)
        context = await local.load_context(text="hello " * 1000)
        # The first run warms the pool and model discovery up.
        walls = [await timed_run(service, "latency", context.context_id, gap_s=0) for _ in range(repeat + 1)][1:]
    median = statistics.median(walls)
    print(
        f"LM delay {delay * 1000:.0f} ms per call, concurrency limit {limit}: ideal {ideal:.3f} s "
        f"({len(replies)} root + {sub_rounds} sub rounds); wall median {median:.3f} s "
        f"[{min(walls):.3f}, {max(walls):.3f}]; ratio wall/ideal {median / ideal:.3f} "
        f"(overhead {(median - ideal) * 1000:.0f} ms over {len(replies)} turns and {3 * limit + 1} sub-calls)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    anyio.run(bench, args.delay, args.limit, args.repeat)


if __name__ == "__main__":
    main()
