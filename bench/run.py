"""Whole-run benchmark: `RlmService.complete` with a real Docker sandbox and the zero-latency
scripted LM in a subprocess, measured the way the reference library was measured (README, "Benchmarks").

    .venv/bin/python bench/run.py [--repeat 5]

Prints min/median/max for:
  one-turn run        load nothing new, one root turn that sets the answer (warm pool)
  per further turn    (a 10-turn run - a 1-turn run) / 9
  per turn, 50 MiB    the same with a 50 MiB context
  per sub-call        a 200-prompt llm_query_batched, per prompt
and the ratio to the reference (`rlms` 0.1.3, Docker environment, same machine kind):
1.5-2.0 s one-turn, 192 ms per turn, 1.8 s per turn at 50 MB, 1.8-3.2 ms per sub-call.
Never fails on a timing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.assembly import build_service
from rlm_mcp.config import Settings
from rlm_mcp.config.lm import LMSettings
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.service.service import RlmService
from rlm_mcp.testing import scripted_lm_process

TURN = "```repl\nx = len(context)\nprint(x)\n```"
DONE = '```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```'
BATCH = '```repl\nr = llm_query_batched(["q%d" % i for i in range(200)])\nanswer["content"] = str(len(r))\nanswer["ready"] = True\n```'
# The scripted LM's replies, by query: a one-turn run, a ten-turn run, a 200-prompt batch.
SCRIPT = {
    "root_by_query": [
        {"match": "one-turn", "replies": [DONE]},
        {"match": "ten-turn", "replies": [TURN] * 9 + [DONE]},
        {"match": "batch", "replies": [BATCH]},
    ],
    "sub_default": "ok",
    "max_model_len": 65536,
}
# The setting's own default (its one owner is the LM settings), for benches that raise it.
DEFAULT_SUB_CALL_LIMIT: int = LMSettings.model_fields["max_sub_calls_per_run"].default
GAP_S = 1.5  # idle before each timed run: the warm pool refills only while no sandbox is in use


async def quiet(progress: float, total: float | None, message: str) -> None:
    return None


@asynccontextmanager
async def bench_service(
    script: dict[str, Any] | None = None,
    *,
    max_concurrent_lm_calls: int = 64,
    max_sub_calls_per_run: int = DEFAULT_SUB_CALL_LIMIT,
) -> AsyncIterator[RlmService]:
    """`RlmService` with real Docker sandboxes (a warm pool of 2) and the scripted LM in a
    subprocess (`script`, by default `SCRIPT`: zero latency), on a data dir of its own."""
    with tempfile.TemporaryDirectory() as tmp, scripted_lm_process(script or SCRIPT) as url:
        settings = Settings(
            base_url=url,
            data_dir=Path(tmp) / "data",
            allowed_roots=[Path(tmp)],
            pool_size=2,
            max_concurrent_lm_calls=max_concurrent_lm_calls,
            max_sub_calls_per_run=max_sub_calls_per_run,
        )
        async with build_service(settings) as service:
            yield service


async def timed_run(service: RlmService, query: str, context_id: str, gap_s: float = GAP_S) -> float:
    """Seconds of one completed run, after `gap_s` of idle."""
    await anyio.sleep(gap_s)
    start = time.perf_counter()
    result = await Caller(service, LOCAL_OWNER).complete(query, context_id, RunOverrides(), quiet)
    assert result.status == "completed", result
    return time.perf_counter() - start


def show(name: str, values: list[float], unit: float, label: str, reference: str) -> None:
    scaled = [v * unit for v in values]
    print(
        f"{name:<22} min {min(scaled):8.1f}  median {statistics.median(scaled):8.1f}  "
        f"max {max(scaled):8.1f} {label}   (reference {reference})"
    )


async def bench(repeat: int) -> None:
    async with bench_service() as service:
        local = Caller(service, LOCAL_OWNER)
        small = await local.load_context(text="hello " * 1000)
        big = await local.load_context(text=("0123456789abcdef" * 64 + "\n") * (50 * 1024 * 1024 // 1025))

        async def timed(query: str, context_id: str, n: int) -> list[float]:
            return [await timed_run(service, query, context_id) for _ in range(n)]

        await timed_run(service, "one-turn warm-up", small.context_id, gap_s=0)
        one = await timed("one-turn", small.context_id, repeat)
        ten = await timed("ten-turn", small.context_id, repeat)
        one_big = await timed("one-turn", big.context_id, max(2, repeat // 2))
        ten_big = await timed("ten-turn", big.context_id, max(2, repeat // 2))
        batch = await timed("batch", small.context_id, repeat)

    per_turn = [(t - statistics.median(one)) / 9 for t in ten]
    per_turn_big = [(t - statistics.median(one_big)) / 9 for t in ten_big]
    per_call = [(t - statistics.median(one)) / 200 for t in batch]
    show("one-turn run", one, 1000, "ms", "1500-2000 ms")
    show("per further turn", per_turn, 1000, "ms", "192 ms")
    show("one-turn run, 50 MiB", one_big, 1000, "ms", "-")
    show("per turn, 50 MiB", per_turn_big, 1000, "ms", "1800 ms")
    show("per sub-call (batch)", per_call, 1000, "ms", "1.8-3.2 ms")
    print(
        f"ratios (reference / ours, medians): one-turn {1.75 / statistics.median(one):.1f}x, "
        f"per turn {0.192 / max(statistics.median(per_turn), 1e-6):.1f}x, "
        f"per turn at 50 MiB {1.8 / max(statistics.median(per_turn_big), 1e-6):.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    anyio.run(bench, args.repeat)


if __name__ == "__main__":
    main()
