"""What honouring the environment (a proxy, `.netrc`) costs per LM request: aiohttp's own
`trust_env`, which looks both up in worker threads on every request, beside rlm-mcp's pool, which
looks them up once per URL (lm/env_routes.py), and beside the pool with the environment ignored
(a loopback endpoint's).

    .venv/bin/python bench/lm_env.py [--calls 400] [--reps 3]

Sequential POSTs of a root call's size to the zero-latency scripted LM in a subprocess, over one
keep-alive connection; no proxy is set, so every request goes direct and only the lookups differ.
The endpoint is on loopback (where rlm-mcp never reads the environment), so the pool is made with
`trust_env` forced on, as it is for an endpoint off loopback. Prints, per variant, the event-loop
thread's CPU per request (`time.thread_time`), the process's (worker threads included) and the
loop rounds per request, median [min, max] over reps taken in turn, and the load average. Print
only; never fails on a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rlm_mcp
from rlm_mcp.lm.http import HttpPool, encode_json
from rlm_mcp.testing import scripted_lm_process

BODY = encode_json({"model": "rlm-v0.1", "messages": [{"role": "user", "content": "x" * 2000}] * 6, "max_tokens": 100})
HEADERS = {"Content-Type": "application/json", "X-Session-ID": "run-1"}

Send = Callable[[], Awaitable[Any]]


async def measure(send: Send, calls: int) -> tuple[float, float, float]:
    """(loop-thread CPU, process CPU, loop rounds) per request over `calls` sequential requests."""
    loop = cast(Any, asyncio.get_running_loop())
    rounds = 0
    run_once = loop._run_once

    def counted() -> None:
        nonlocal rounds
        rounds += 1
        run_once()

    loop._run_once = counted
    thread, process = time.thread_time(), time.process_time()
    try:
        for _ in range(calls):
            await send()
    finally:
        del loop._run_once
    return (time.thread_time() - thread) / calls, (time.process_time() - process) / calls, rounds / calls


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def bench(calls: int, reps: int) -> None:
    with scripted_lm_process({"root_default": "ok", "sub_default": "ok", "max_model_len": 65536}) as base:
        url = f"{base}/chat/completions"
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=True)
        routed = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=True)
        direct = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=False)

        async def aiohttp_trust_env() -> None:
            async with session.post(url, data=BODY, headers=HEADERS) as resp:
                await resp.read()

        async def pool_routed() -> None:
            await routed.request("POST", url, json_body=BODY, headers=HEADERS)

        async def pool_direct() -> None:
            await direct.request("POST", url, json_body=BODY, headers=HEADERS)

        variants: dict[str, Send] = {
            "aiohttp trust_env (before)": aiohttp_trust_env,
            "pool, environment read once per URL": pool_routed,
            "pool, environment ignored (loopback)": pool_direct,
        }
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
        load_before = _load()
        try:
            for send in variants.values():  # warm-up: connections open, lookups made
                for _ in range(20):
                    await send()
            for _ in range(reps):
                for name, send in variants.items():
                    figures[name].append(await measure(send, calls))
        finally:
            await session.close()
            await routed.aclose()
            await direct.aclose()
    print(f"{calls} sequential requests x {reps} reps per variant; load average {load_before} -> {_load()}")
    for name, rows in figures.items():
        loop_us = sorted(r[0] * 1e6 for r in rows)
        proc_us = sorted(r[1] * 1e6 for r in rows)
        print(
            f"  {name}: loop thread {statistics.median(loop_us):.0f} µs [{loop_us[0]:.0f}, {loop_us[-1]:.0f}], "
            f"process {statistics.median(proc_us):.0f} µs [{proc_us[0]:.0f}, {proc_us[-1]:.0f}] per request, "
            f"{statistics.median(r[2] for r in rows):.2f} loop rounds"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        os.environ.pop(name, None)  # every variant goes direct: only the lookups differ
    anyio.run(bench, args.calls, args.reps)


if __name__ == "__main__":
    main()
