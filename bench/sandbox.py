"""Sandbox benchmark (run by hand: `.venv/bin/python bench/sandbox.py`). Needs Docker and the image.

Measures cold start to kernel-ready, warm acquire, a trivial cell's round trip, the sub-LM
bridge overhead (zero-latency bridge), a 16-way batch, and context loading throughput.
Under another runtime or engine: `RLM_MCP_SANDBOX_RUNTIME=runsc`, or `DOCKER_HOST` at Podman's
service (the first line names the engine measured). `--record` also writes the figures to
bench/results/sandbox.json (the docs' Benchmarks page), with this machine and today's date.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_file import ResultFile  # bench/ is on sys.path: this script's own folder

from rlm_mcp.config import Settings
from rlm_mcp.ports import ContextSpec, LMRequest
from rlm_mcp.sandbox.docker.container import KernelContainer
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.sandbox.session import load_contexts
from rlm_mcp.testing.sandboxes import docker_client, pool_ready

RECORD = ResultFile("sandbox", "The sandbox alone", ["what", "median", "min–max", "target"])


async def zero_bridge(request: LMRequest) -> list[str]:
    return ["ok"] * len(request.prompts)


def report(name: str, samples: list[float], target: float | None, unit: str = "ms", scale: float = 1000.0) -> None:
    values = [s * scale for s in samples]
    med = statistics.median(values)
    ratio = f"  target {target:g} {unit}: {med / target:.2f}x of target" if target else ""
    print(f"{name:<34} min {min(values):8.2f}  median {med:8.2f}  max {max(values):8.2f} {unit}{ratio}")
    spread = f"{min(values):.2f}–{max(values):.2f} {unit}" if len(values) > 1 else ""
    RECORD.add(name, f"{med:.2f} {unit}", spread, f"≤ {target:g} {unit}" if target else "—")


async def timed(fn: Callable[[], Awaitable[object]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


async def main(mib: int, calls: int) -> None:
    settings = Settings(pool_size=2, cell_timeout_s=60)
    async with SandboxManager(settings.sandbox) as mgr:
        await mgr.ensure_ready()
        client = await docker_client(mgr)
        engine = getattr(mgr.backend, "engine", None)
        print(f"engine: {engine.describe() if engine else '?'}")
        RECORD.note = f"engine: {engine.describe() if engine else '?'}"

        while pool_ready(mgr) < settings.sandbox.pool_size:  # its refills' CPU is not the starts'
            await anyio.sleep(0.05)
        cold: list[float] = []
        cpu: list[float] = []  # this process's, all threads: the Docker calls run in worker threads
        for _ in range(10):
            t, c0 = time.perf_counter(), time.process_time()
            c = await KernelContainer.start(client, settings.sandbox, mgr.owner_id, engine)
            cold.append(time.perf_counter() - t)
            await c.kill()
            cpu.append(time.process_time() - c0)
        report("cold start to kernel-ready", cold, None)
        report("server CPU per start and removal", cpu, None)

        warm: list[float] = []
        for _ in range(8):
            while pool_ready(mgr) < 1:
                await anyio.sleep(0.05)
            t = time.perf_counter()
            cm = mgr.open([])
            await cm.__aenter__()
            warm.append(time.perf_counter() - t)
            await cm.__aexit__(None, None, None)
        report("warm acquire (open, no contexts)", warm, 20.0)

        async with mgr.open([]) as sb:
            await sb.execute("pass", zero_bridge)
            report("trivial cell round trip", await timed(lambda: sb.execute("x = 1", zero_bridge), 200), 5.0)
            n = calls
            t = time.perf_counter()
            await sb.execute(f"for i in range({n}):\n    llm_query('p')", zero_bridge)
            per_call = (time.perf_counter() - t) / n
            base = statistics.median(await timed(lambda: sb.execute(f"for i in range({n}):\n    pass", zero_bridge), 5))
            report("llm_query bridge overhead / call", [per_call - base / n], 2.0)
            report(
                "16-way llm_query_batched / batch",
                await timed(lambda: sb.execute("llm_query_batched(['p'] * 16)", zero_bridge), 100),
                None,
            )

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ctx.txt"
            data = (b"lorem ipsum dolor sit amet, consectetur adipiscing elit. " * (mib * 2**20 // 57 + 1))[
                : mib * 2**20
            ]
            path.write_bytes(data)
            spec = ContextSpec(path=path, format="text", kind="str", chars=len(data), bytes=len(data))
            loads: list[float] = []
            for _ in range(3):
                c = await KernelContainer.start(client, settings.sandbox, mgr.owner_id, engine)
                t = time.perf_counter()
                await load_contexts(c, [spec], settings.sandbox)
                loads.append(time.perf_counter() - t)
                await c.kill()
            report(f"{mib} MiB context load", loads, 1000.0 if mib == 50 else None)
            print(f"{'context load throughput':<34} median {mib / statistics.median(loads):8.1f} MiB/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=50, help="size of the loaded context (default 50)")
    parser.add_argument("--calls", type=int, default=500, help="sequential llm_query calls timed (default 500)")
    parser.add_argument("--record", action="store_true", help="write bench/results/sandbox.json (the docs' figures)")
    args = parser.parse_args()
    anyio.run(main, args.mib, args.calls)
    if args.record:
        print(f"recorded {RECORD.write()}")
