"""LM-layer micro-benchmark: LMClient against the zero-latency scripted server on loopback.

The server runs in a subprocess, as vLLM would: in-process, its thread and the client's event
loop would share one GIL and measure Python's thread switching instead.

    .venv/bin/python bench/lm.py [--calls 500]

Prints per-call latency (sequential, the connection reused) and batched throughput, with the CPU
time per call of this process (the client) and of the server, and first the server's own floor:
the same requests written on raw keep-alive sockets (no HTTP client at all). The bar, the
design's target: 1.8-3.2 ms per sub-call with connection reuse (a 40 ms figure means a delayed-ACK
stall). Never fails on a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.lm.client import LMClient
from rlm_mcp.testing import read_log, scripted_lm_process

BODY = json.dumps({"model": "rlm-v0.1", "messages": [{"role": "user", "content": "q"}], "max_tokens": 16}).encode()


def child_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children: the scripted server."""
    total = 0.0
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{tid}/children") as fh:
            for pid in fh.read().split():
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def raw_calls(url: str, calls: int) -> None:
    """Requests written on a raw keep-alive socket, replies read by Content-Length."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(BODY), BODY)
    )
    async with await anyio.connect_tcp(host, int(port)) as stream:
        buffered = b""
        for _ in range(calls):
            await stream.send(request)
            while b"\r\n\r\n" not in buffered:
                buffered += await stream.receive()
            head, _, buffered = buffered.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            while len(buffered) < length:
                buffered += await stream.receive()
            buffered = buffered[length:]


def cpu_line(calls: int, wall: float, client0: float, server0: float) -> str:
    return (
        f"{calls} calls in {wall:.3f} s = {calls / wall:,.0f} calls/s; CPU per call: client "
        f"{(time.process_time() - client0) / calls * 1000:.3f} ms, server {(child_cpu_s() - server0) / calls * 1000:.3f} ms"
    )


async def bench(calls: int) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        scripted_lm_process({"sub_default": "ok"}, log_path=Path(tmp) / "log") as url,
    ):
        for concurrency in (1, 16):
            client0, server0, started = time.process_time(), child_cpu_s(), time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(raw_calls, url, calls // concurrency)
            done = calls // concurrency * concurrency
            print(
                f"server floor, raw sockets, concurrency {concurrency:>3}: "
                f"{cpu_line(done, time.perf_counter() - started, client0, server0)}"
            )
        for concurrency in (1, 16, 64):
            settings = Settings(base_url=url, max_concurrent_lm_calls=concurrency)
            async with LMClient(settings.lm) as client:
                msgs = [{"role": "user", "content": "warm up"}]
                await client.complete(msgs, model="rlm-v0.1", max_tokens=16, role="sub")
                latencies: list[float] = []

                async def one(i: int, latencies: list[float] = latencies) -> None:
                    out = await client.complete(
                        [{"role": "user", "content": f"q{i}"}], model="rlm-v0.1", max_tokens=16, role="sub"
                    )
                    latencies.append(out.record.latency_s)

                client0, server0, started = time.process_time(), child_cpu_s(), time.perf_counter()
                if concurrency == 1:
                    for i in range(calls):
                        await one(i)
                else:
                    async with anyio.create_task_group() as tg:
                        for i in range(calls):
                            tg.start_soon(one, i)
                wall = time.perf_counter() - started
                cpu = cpu_line(calls, wall, client0, server0)
            print(
                f"LMClient, concurrency {concurrency:>3}: {cpu}; "
                f"median latency (slot wait excluded) {statistics.median(latencies) * 1000:.2f} ms"
            )
        print(f"server saw {len(read_log(Path(tmp) / 'log'))} chat requests (LMClient and raw)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    anyio.run(bench, parser.parse_args().calls)


if __name__ == "__main__":
    main()
