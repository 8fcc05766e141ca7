"""Scale and soak of one rlm-mcp server (issue 12 item 4), over stdio or streamable HTTP.

    .venv/bin/python bench/scale.py scale [--transport stdio|http] [--runs 16] [--turns 10]
    .venv/bin/python bench/scale.py soak  [--transport stdio|http] [--sequential 1000] [--concurrent 200]
    .venv/bin/python bench/scale.py team  [--runs 32] [--turns 10] [--lease 10]   (team mode: bench/team_scale.py)

The server is the real console script in a subprocess; the LM is the zero-latency scripted server;
all runs of a mode share one MCP session.

scale: the server's own CPU time (user + system, from /proc) per turn for single runs one after
another, then for --runs runs at once (run and sandbox limits raised to --runs); prints both, their
ratio (target <= 1.5) and slowest/fastest completion of the concurrent runs (target <= 2). The warm
pool is --runs sandboxes and full before each round, so no run waits for a cold start.

soak: --sequential runs one after another, then --concurrent runs 8 at a time. RSS, open fds,
threads and this server's containers are sampled after a warm-up (the baseline), along the way and
at the end (containers after their background removal, with a deadline; fds and threads also after
--settle idle seconds, when idle worker threads and kept-alive connections are gone); prints the growth
(target RSS <= 10 MB, the rest back to baseline) and the RSS slope per run (least squares).
Never fails on a timing.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import team_scale  # bench/team_scale.py, beside this file
from mcp import Client, StdioServerParameters

from rlm_mcp.testing import scripted_lm_process
from rlm_mcp.testing.servers import free_port, server_process

SERVER = Path(sys.executable).parent / "rlm-mcp"
TURN = "```repl\nprint(len(context))\n```"
DONE = '```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```'
SOAK_PARALLEL = 8


def script(turns: int) -> dict[str, Any]:
    return {
        "max_model_len": 65536,
        "sub_default": "ok",
        "root_by_query": [
            {"match": "scale run", "replies": [TURN] * (turns - 1) + [DONE]},
            {"match": "soak run", "replies": [DONE]},
        ],
    }


def proc_sample(pid: int) -> dict[str, float]:
    """CPU seconds, RSS (MB), open fds and threads of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "cpu": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
        "rss": int(status["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(status["Threads"]),
    }


def container_states(owner: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=rlm-mcp.owner={owner}", "--format", "{{.State}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def containers(owner: str) -> int:
    return len(container_states(owner))


def server_env(url: str, tmp: Path, owner: str, limit: int) -> dict[str, str]:
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "RLM_MCP_BASE_URL": url,
        "RLM_MCP_DATA_DIR": str(tmp / "data"),
        "RLM_MCP_ALLOWED_ROOTS": str(tmp),
        "RLM_MCP_POOL_SIZE": "2",
        "RLM_MCP_LOG_LEVEL": "WARNING",
        "RLM_MCP_INSTANCE_ID": owner,
        "RLM_MCP_MAX_RUNS": str(limit),
        "RLM_MCP_MAX_SANDBOXES": str(limit + 2),
    }
    for name in ("DOCKER_HOST", "RLM_MCP_SANDBOX_TOTAL_CPUS"):  # the latter: to compare CPU-share updates
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@asynccontextmanager
async def server(transport: str, env: dict[str, str]) -> AsyncIterator[tuple[Client, int]]:
    """An MCP session with a fresh server, and the server's pid."""
    if transport == "stdio":
        async with Client(StdioServerParameters(command=str(SERVER), args=[], env=env)) as client:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_child_server(int(p))]
            yield client, pids[0]
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    token = secrets.token_hex(16)
    port = free_port()
    argv = [str(SERVER), "serve", "--transport", "http", "--port", str(port)]
    with ExitStack() as stack:
        start = server_process(argv, port=port, env={**env, "RLM_MCP_AUTH_TOKEN": token}, quiet=False)
        try:
            proc = await anyio.to_thread.run_sync(stack.enter_context, start)
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=600)
            async with http, Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client:
                yield client, proc.pid
        finally:
            await anyio.to_thread.run_sync(stack.close)


def _is_child_server(pid: int) -> bool:
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return ppid == os.getpid() and b"rlm-mcp" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


async def one_run(client: Client, context_id: str, query: str) -> float:
    started = time.perf_counter()
    result = await client.call_tool("rlm_complete", {"query": query, "context_id": context_id, "max_iterations": 50})
    if (result.structured_content or {}).get("answer") != "done":
        raise RuntimeError(f"unexpected result: {result.structured_content!r}")
    return time.perf_counter() - started


async def scale(client: Client, pid: int, owner: str, context_id: str, args: argparse.Namespace) -> None:
    await one_run(client, context_id, "scale run warm-up")
    await containers_settle(owner, args.pool)
    before = proc_sample(pid)["cpu"]
    for i in range(args.single):
        await one_run(client, context_id, f"scale run single {i}")
    single = (proc_sample(pid)["cpu"] - before) / (args.single * args.turns)
    walls: list[float] = []

    async def timed(i: int) -> None:
        walls.append(await one_run(client, context_id, f"scale run concurrent {i}"))

    await containers_settle(owner, args.pool)  # every run starts on a warm sandbox
    before, started = proc_sample(pid)["cpu"], time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(args.runs):
            tg.start_soon(timed, i)
    wall = time.perf_counter() - started
    many = (proc_sample(pid)["cpu"] - before) / (args.runs * args.turns)
    print(
        f"server CPU per turn: single runs {single * 1000:.2f} ms; {args.runs} runs at once {many * 1000:.2f} ms; "
        # /proc counts CPU in clock ticks (10 ms): a few short single runs may not fill one.
        + (f"ratio {many / single:.2f} (target <= 1.5)" if single else "ratio: single runs under one clock tick")
    )
    print(
        f"{args.runs} runs of {args.turns} turns at once: wall {wall:.2f} s; completions min {min(walls):.2f} s, "
        f"median {statistics.median(walls):.2f} s, max {max(walls):.2f} s; slowest/fastest "
        f"{max(walls) / min(walls):.2f} (target <= 2)"
    )


def slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


async def containers_settle(owner: str, target: int) -> int:
    """This server's containers once `target` of them are running and nothing else is left, twice
    in a row (60 s at most): used ones stop and are removed in the background, and the warm pool
    refills in the background, so a count alone may include a used one about to go."""
    seen = 0
    with anyio.move_on_after(60):
        while True:
            states = await anyio.to_thread.run_sync(container_states, owner)
            seen = seen + 1 if len(states) == target and set(states) <= {"running"} else 0
            if seen == 2:
                return len(states)
            await anyio.sleep(0.5)
    return await anyio.to_thread.run_sync(containers, owner)


async def runs_at_once(client: Client, context_id: str, label: str, count: int) -> None:
    """`count` runs, SOAK_PARALLEL at a time."""
    limiter = anyio.CapacityLimiter(SOAK_PARALLEL)

    async def limited(i: int) -> None:
        async with limiter:
            await one_run(client, context_id, f"{label} {i}")

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(limited, i)


async def soak(client: Client, pid: int, owner: str, context_id: str, args: argparse.Namespace) -> None:
    warm = max(1, min(50, args.sequential // 10))
    for i in range(warm):
        await one_run(client, context_id, f"soak run warm-up {i}")
    # And one concurrent round: bounded pools (Docker API keep-alive connections, SQLite
    # connections, worker threads) grow to their working size once; the baseline includes them.
    # No wider than the measured concurrent runs (a smoke's few need no 16-run warm-up).
    warm_concurrent = min(2 * SOAK_PARALLEL, args.concurrent)
    await runs_at_once(client, context_id, "soak run concurrent warm-up", warm_concurrent)
    base_containers = await containers_settle(owner, args.pool)
    base = proc_sample(pid)
    every = max(1, args.sequential // 20)
    rss: list[tuple[float, float]] = [(0, base["rss"])]
    for i in range(args.sequential):
        await one_run(client, context_id, f"soak run sequential {i}")
        if (i + 1) % every == 0:
            rss.append((i + 1, proc_sample(pid)["rss"]))
    await runs_at_once(client, context_id, "soak run concurrent", args.concurrent)
    end_containers = await containers_settle(owner, base_containers)
    loaded = proc_sample(pid)
    # Idle kept-alive LM connections close after 15 s; anyio's worker threads idle for 10 s exit
    # when the next blocking call is made: one more run after the pause.
    await anyio.sleep(args.settle)
    await one_run(client, context_id, "soak run after the pause")
    await containers_settle(owner, base_containers)
    end = proc_sample(pid)
    rss.append((args.sequential + args.concurrent, end["rss"]))
    print(
        f"soak: {warm} warm-up runs and {warm_concurrent} concurrent ones, then {args.sequential} sequential and {args.concurrent} concurrent "
        f"({SOAK_PARALLEL} at a time)"
    )
    print(
        f"RSS {base['rss']:.1f} -> {end['rss']:.1f} MB (growth {end['rss'] - base['rss']:+.1f} MB, target <= 10); "
        f"slope {slope(rss[:-1]) * 1024:+.2f} KB per sequential run over {len(rss) - 1} samples"
    )
    print(
        f"right after the last run: open fds {loaded['fds']:.0f}, threads {loaded['threads']:.0f}; "
        f"after {args.settle:g} s idle and one more run: open fds {base['fds']:.0f} -> {end['fds']:.0f}, "
        f"threads {base['threads']:.0f} -> {end['threads']:.0f}; containers {base_containers} -> {end_containers} "
        "(baseline: the warm pool)"
    )


async def main_async(args: argparse.Namespace) -> None:
    owner = f"bench-{secrets.token_hex(6)}"
    limit = args.runs if args.mode == "scale" else SOAK_PARALLEL
    with tempfile.TemporaryDirectory(prefix="rlm-scale-") as tmp_name, scripted_lm_process(script(args.turns)) as url:
        tmp = Path(tmp_name)
        env = server_env(url, tmp, owner, limit)
        env["RLM_MCP_POOL_SIZE"] = str(args.pool)
        async with server(args.transport, env) as (client, pid):
            loaded = await client.call_tool("rlm_load_context", {"text": "0123456789abcdef\n" * 4096})
            context_id = (loaded.structured_content or {})["context_id"]
            print(f"{args.mode} over {args.transport}; machine: {os.cpu_count()} CPUs")
            if args.mode == "scale":
                await scale(client, pid, owner, context_id, args)
            else:
                await soak(client, pid, owner, context_id, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["scale", "soak", "team"])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--runs", type=int, default=None, help="scale: runs at once (16); team: over two workers (32)")
    parser.add_argument("--single", type=int, default=4, help="scale: single runs for the baseline")
    parser.add_argument("--turns", type=int, default=10, help="scale: turns per run")
    parser.add_argument("--sequential", type=int, default=1000, help="soak: runs one after another")
    parser.add_argument("--concurrent", type=int, default=200, help=f"soak: runs {SOAK_PARALLEL} at a time")
    parser.add_argument("--settle", type=float, default=20.0, help="soak: idle seconds before the last sample")
    parser.add_argument("--pool", type=int, default=None, help="warm pool size (scale: --runs; soak: 2)")
    team_scale.add_arguments(parser)
    args = parser.parse_args()
    if args.runs is None:
        args.runs = 32 if args.mode == "team" else 16
    if args.mode == "team":
        args.pool = args.pool or 4
        anyio.run(team_scale.team, args, (server, server_env))
        return
    if args.pool is None:
        args.pool = min(args.runs, 32) if args.mode == "scale" else 2
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
