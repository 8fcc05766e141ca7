"""MCP round trip over stdio: two `rlm-mcp` servers (e.g. main's venv and this checkout's)
driven by one client, calls alternating between them, so both see the same machine load.

    .venv/bin/python bench/stdio_rtt.py --a /work/main/.venv/bin/rlm-mcp [--b .venv/bin/rlm-mcp]
        [--calls 600] [--tool rlm_list_contexts]

Each call is a cheap tool (no run, no sandbox: the pool is off), so the figure is the transport
and the SDK's dispatch: the request in, the handler, the answer out. Prints each server's median
and quartiles and the median of b/a per pair of consecutive calls (the ratio is the figure on a
loaded machine: both sides of a pair see the same load). Never fails on a timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench's own modules
from bench.compare_reference import script, server_env
from rlm_mcp.testing import scripted_lm_process


async def main_async(args: argparse.Namespace) -> None:
    servers = {"a": args.a, "b": args.b or str(Path(sys.executable).parent / "rlm-mcp")}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlm-bench-") as tmp_name, scripted_lm_process(script()) as url:
        tmp = Path(tmp_name)
        async with AsyncExitStack() as stack:
            clients: dict[str, Client] = {}
            for key, command in servers.items():
                env = {**server_env(url, tmp / f"data-{key}", tmp), "RLM_MCP_POOL_SIZE": "0"}
                params = StdioServerParameters(command=command, args=[], env=env)
                clients[key] = await stack.enter_async_context(Client(params))
                for _ in range(5):  # warm-up
                    await clients[key].call_tool(args.tool, {})
            times: dict[str, list[float]] = {key: [] for key in servers}
            for i in range(args.calls):
                order = ["a", "b"] if i % 2 else ["b", "a"]
                for key in order:
                    await anyio.sleep(0.005)  # the other server's answer fully handled first
                    started = time.perf_counter()
                    await clients[key].call_tool(args.tool, {})
                    times[key].append(time.perf_counter() - started)
    load = " -> ".join("/".join(f"{x:.1f}" for x in v) for v in (load_before, os.getloadavg()))
    print(f"load average (1, 5, 15 min) {load}; {args.calls} calls of {args.tool} each")
    for key, values in times.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        print(f"{key} {servers[key]}: median {statistics.median(values) * 1e3:.2f} ms [{q1 * 1e3:.2f}, {q3 * 1e3:.2f}]")
    ratios = [b / a for a, b in zip(times["a"], times["b"], strict=True)]
    print(f"b / a per pair: median {statistics.median(ratios):.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="the first server's rlm-mcp executable")
    parser.add_argument("--b", default="", help="the second's (default: this venv's)")
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--tool", default="rlm_list_contexts", help="a tool that takes no arguments")
    anyio.run(main_async, parser.parse_args(argv))


if __name__ == "__main__":
    main()
