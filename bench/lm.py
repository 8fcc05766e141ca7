"""LM-layer micro-benchmark: LMClient against the zero-latency scripted server on loopback.

The server runs in a subprocess, as vLLM would: in-process, its thread and the client's event
loop would share one GIL and measure Python's thread switching instead.

    .venv/bin/python bench/lm.py [--calls 500]

Prints per-call latency (sequential, the connection reused) and batched throughput. The bar
from DESIGN §7: 1.8-3.2 ms per sub-call with connection reuse (a 40 ms figure means a
delayed-ACK stall). Never fails on a timing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.lm.client import LMClient
from rlm_mcp.testing import read_log, scripted_lm_process


async def bench(calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, scripted_lm_process({"sub_default": "ok"},
                                                                   log_path=Path(tmp) / "log") as url:
        for concurrency in (1, 16, 64):
            settings = Settings(base_url=url, max_concurrent_lm_calls=concurrency)
            async with LMClient(settings) as client:
                msgs = [{"role": "user", "content": "warm up"}]
                await client.complete(msgs, model="rlm-v0.1", max_tokens=16, role="sub")
                latencies: list[float] = []

                async def one(i: int) -> None:
                    out = await client.complete([{"role": "user", "content": f"q{i}"}], model="rlm-v0.1",
                                                max_tokens=16, role="sub")
                    latencies.append(out.record.latency_s)

                started = time.perf_counter()
                if concurrency == 1:
                    for i in range(calls):
                        await one(i)
                else:
                    async with anyio.create_task_group() as tg:
                        for i in range(calls):
                            tg.start_soon(one, i)
                wall = time.perf_counter() - started
            print(f"concurrency {concurrency:>3}: {calls} calls in {wall:.3f} s = {calls / wall:,.0f} calls/s; "
                  f"median latency (slot wait excluded) {statistics.median(latencies) * 1000:.2f} ms")
        print(f"server saw {len(read_log(Path(tmp) / 'log'))} chat requests")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    anyio.run(bench, parser.parse_args().calls)


if __name__ == "__main__":
    main()
