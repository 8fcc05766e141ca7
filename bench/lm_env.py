"""The LM client's HTTP pools per request, before and after: honouring the environment (a proxy,
`.netrc`) for an endpoint off loopback, and plain http to a loopback endpoint.

    .venv/bin/python bench/lm_env.py [--calls 400] [--reps 3]

Sequential POSTs of a root call's size to the zero-latency scripted LM in a subprocess, over one
keep-alive connection; no proxy is set, so every request goes direct. Four variants, reps taken
in turn:
  aiohttp, trust_env (before, off loopback): aiohttp looks the proxy and `.netrc` up in worker
    threads on every request;
  pool, environment read once per URL (now, off loopback): lm/env_routes.py, then aiohttp;
  aiohttp, environment ignored (before, loopback);
  pool, plain http (now, loopback): lm/plain_http.py.
The endpoint is on loopback; the off-loopback variants force `trust_env` on, as an endpoint off
loopback has it. Prints, per variant, the event-loop thread's CPU per request
(`time.thread_time`), the process's (worker threads included) and the loop rounds per request,
median [min, max] over reps, and the load average. Print only; never fails on a timing.
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
        bare = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=False)
        routed = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=True)
        direct = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=False)

        async def aiohttp_trust_env() -> None:
            async with session.post(url, data=BODY, headers=HEADERS) as resp:
                await resp.read()

        async def aiohttp_bare() -> None:
            async with bare.post(url, data=BODY, headers=HEADERS) as resp:
                await resp.read()

        async def pool_routed() -> None:
            await routed.request("POST", url, json_body=BODY, headers=HEADERS)

        async def pool_direct() -> None:
            await direct.request("POST", url, json_body=BODY, headers=HEADERS)

        variants: dict[str, Send] = {
            "aiohttp, trust_env (before, off loopback)": aiohttp_trust_env,
            "pool, environment read once per URL (now, off loopback)": pool_routed,
            "aiohttp, environment ignored (before, loopback)": aiohttp_bare,
            "pool, plain http (now, loopback)": pool_direct,
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
            await bare.close()
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
