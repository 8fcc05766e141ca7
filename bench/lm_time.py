"""Overhead against the LM's own time: rlm-mcp (and, beside it, the reference library) on a
scripted LM with realistic latency, reporting wall ÷ ideal per scenario.

    .venv/bin/python bench/lm_time.py [--reps 3] [--root-delay 0.5] [--sub-delay 0.2]
        [--tokens-per-s 100] [--concurrency 16] [--big-mib 50] [--only fan_200 ...] [--record]
        [--reference-python /work/rlms-venv/bin/python]   # the reference beside it (by hand)
        [--server OTHER/.venv/bin/rlm-mcp]                 # another checkout's server instead of this one
        [--before OLD/.venv/bin/rlm-mcp]                   # A/B: an older tree's server beside this one

The scripted server (rlm_mcp.testing.scripted_lm) takes `--root-delay` / `--sub-delay` seconds
per call plus completion tokens / `--tokens-per-s`, and serves at most `--concurrency` requests
at once, queueing the rest in arrival order. rlm-mcp runs as a real `rlm-mcp` stdio server
(its LM concurrency limit above the server's, so the server is what bounds a batch).

The ideal is the LM's critical path: the sum over sequential rounds of LM calls of the scripted
latency of each round, a batch of n sub-calls at concurrency c counting ceil(n / c) rounds, and
children running in parallel counting as their longest path. Scenarios: bench/compare_reference.py's
six (their trajectories), a 200-way fan-out, and depth-2 children (rlm-mcp only: the reference
driver runs depth 1). Beside the wall time, the rlm-mcp server's own CPU during each run (from
/proc): on a loaded machine the wall overhead is mostly waiting for a CPU, which this separates
from what the harness spends. Never fails on a timing.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench's own modules
from bench.compare_reference import (
    BATCH,
    DONE,
    MODEL,
    SCENARIOS,
    SIZES,
    Ours,
    Reference,
    ensure_reference_image,
    query_for,
    server_env,
    write_contexts,
)
from bench.procfs import children_named, cpu_seconds
from bench.results_file import ResultFile
from rlm_mcp.testing import Script, scripted_lm_process

FAN = '```repl\nr = llm_query_batched(["q%d" % i for i in range(200)])\nprint(len(r))\n```'
CHILDREN = 4
SPAWN = f'```repl\nr = rlm_query_batched(["child task %d" % i for i in range({CHILDREN})])\nprint(r)\n```'
CHILD_TURN = '```repl\nprint(llm_query("child sub"))\n```'
CHILD_DONE = '```repl\nanswer["content"] = "child"\nanswer["ready"] = True\n```'


@dataclass
class Step:
    """One root turn: its reply, the sub-calls its cell makes, and the children it waits for."""

    reply: str
    subs: int = 0
    children: list[list[Step]] = field(default_factory=list)


def steps_of(replies: list[str]) -> list[Step]:
    subs = {BATCH: 16, FAN: 200}
    return [Step(r, subs.get(r, 0)) for r in replies]


CHILD_PATH = [Step(CHILD_TURN, 1), Step(CHILD_DONE)]
# name -> (context key, trajectory, whether the reference driver can run it)
TRAJECTORIES: dict[str, tuple[str, list[Step], bool]] = {
    **{name: (ctx, steps_of(replies), True) for name, (ctx, replies) in SCENARIOS.items()},
    "fan_200": ("1m", steps_of([FAN, DONE]), True),
    "children_d2": ("1k", [Step(SPAWN, children=[CHILD_PATH] * CHILDREN), Step(DONE)], False),
}


def ideal_s(path: list[Step], script: Script, concurrency: int) -> float:
    """The LM's critical path of a trajectory (children: the longest child, all in parallel)."""
    total = 0.0
    for step in path:
        total += script.scripted_latency_s("root", step.reply)
        if step.subs:
            total += math.ceil(step.subs / concurrency) * script.scripted_latency_s("sub", "ok")
        if step.children:
            total += max(ideal_s(child, script, concurrency) for child in step.children)
    return total


def make_script(args: argparse.Namespace) -> Script:
    return Script(
        model=MODEL,
        max_model_len=65536,
        root_by_query=[
            {"match": f"scenario {name}:", "replies": [s.reply for s in path]}
            for name, (_, path, _) in TRAJECTORIES.items()
        ],
        # A child's query is not in its metadata (its prompt is): whatever matches no scenario
        # is a child.
        root=[s.reply for s in CHILD_PATH],
        sub_default="ok",
        delay_s={"root": args.root_delay, "sub": args.sub_delay},
        tokens_per_s=args.tokens_per_s,
        max_concurrency=args.concurrency,
    )


async def main_async(args: argparse.Namespace) -> None:
    SIZES["50m"] = args.big_mib << 20
    script = make_script(args)
    ideal = {name: ideal_s(path, script, args.concurrency) for name, (_, path, _) in TRAJECTORIES.items()}
    if args.reference_python:
        ensure_reference_image(args.reference_python)
    load_before = os.getloadavg()
    chosen = {name: TRAJECTORIES[name] for name in (args.only or TRAJECTORIES)}
    servers = [Server("rlm-mcp", args.server or str(Path(sys.executable).parent / "rlm-mcp"), chosen)]
    if args.before:
        servers.append(Server("before", args.before, chosen))
    ref_raw: dict[str, list[float]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="rlm-bench-") as tmp_name, scripted_lm_process(script) as url:
        tmp = Path(tmp_name)
        paths = write_contexts(tmp)
        reference = Reference(args.reference_python, url, tmp) if args.reference_python else None
        try:
            async with AsyncExitStack() as stack:
                for index, server in enumerate(servers):
                    await server.start(stack, args, url, tmp / f"data{index}", tmp, paths)
                for rep in range(args.reps):
                    # With --before, the two servers take turns, and which goes first alternates
                    # per rep: a drift in the machine's load falls on both alike.
                    order = servers if rep % 2 == 0 else servers[::-1]
                    for name, (ctx, _, ref_ok) in chosen.items():
                        for server in order:
                            await server.settle(args)  # a warm start: the pool refilled, used sandboxes gone
                            await server.measure(name, ctx)
                        if reference is not None and ref_ok:
                            ref_raw[name].append(await anyio.to_thread.run_sync(reference.run, name, paths[ctx]))
                    print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
        finally:
            if reference is not None:
                reference.close()
    args.load = (load_before, os.getloadavg())
    ours = servers[0]
    report(args, ideal, ours.walls, ours.cpu, ref_raw)
    if args.before:
        compare(ideal, ours, servers[1])


class Server:
    """One `rlm-mcp` stdio server under test (this checkout's, or another's with --before/--server):
    its client, context ids, process, and what each run took."""

    def __init__(self, label: str, executable: str, chosen: dict[str, Any]) -> None:
        self.label = label
        self.executable = executable
        self.walls: dict[str, list[float]] = {name: [] for name in chosen}
        self.cpu: dict[str, list[float]] = {name: [] for name in chosen}  # the server's CPU per run
        self.client: Client | None = None
        self.ids: dict[str, str] = {}
        self.pid = 0

    async def start(
        self, stack: AsyncExitStack, args: argparse.Namespace, url: str, data: Path, root: Path, paths: dict[str, Path]
    ) -> None:
        env = {
            **server_env(url, data, root),
            "RLM_MCP_MAX_DEPTH": "2",
            "RLM_MCP_MAX_CONCURRENT_LM_CALLS": str(max(64, args.concurrency)),
            # Warm sandboxes for the parent and its children: a smaller pool measures cold starts
            # (seconds each on a loaded 2-core machine), not the harness.
            "RLM_MCP_POOL_SIZE": str(args.pool),
        }
        self.owner = env["RLM_MCP_INSTANCE_ID"]  # its sandboxes' owner label
        params = StdioServerParameters(command=self.executable, args=[], env=env)
        known = set(children_named(os.getpid(), Path(self.executable).name))
        self.client = client = await stack.enter_async_context(Client(params))
        for key, path in paths.items():
            handle = await client.call_tool("rlm_load_context", {"path": str(path)})
            self.ids[key] = (handle.structured_content or {})["context_id"]
        await Ours(client, self.ids).run("one_1k")  # warm-up: pool filled, model discovered
        (self.pid,) = set(children_named(os.getpid(), Path(self.executable).name)) - known

    async def settle(self, args: argparse.Namespace) -> None:
        """Wait (at most SETTLE_MAX_S) until the server's sandboxes have been its warm pool alone,
        all running and the same ones, for STEADY_S: the pool refills while no sandbox is in
        use, a run of children takes five, which a loaded 2-core host does not start again
        within a fixed pause, and a used sandbox stays running until its removal (up to a second
        after the run). Then `--gap` seconds more. `--gap 0` (smoke runs) waits for nothing."""
        if args.gap <= 0:
            return
        seen: tuple[frozenset[str], float] = (frozenset(), 0.0)
        with anyio.move_on_after(SETTLE_MAX_S):
            while True:
                ids = await anyio.to_thread.run_sync(pool_ids, self.owner, args.pool)
                now = time.monotonic()
                if ids is None or ids != seen[0]:
                    seen = (ids or frozenset(), now)
                elif now - seen[1] >= STEADY_S:
                    break
                await anyio.sleep(0.25)
        await anyio.sleep(args.gap)

    async def measure(self, name: str, ctx: str) -> None:
        assert self.client is not None
        cpu0 = cpu_seconds(self.pid)
        self.walls[name].append(await run_ours(self.client, self.ids[ctx], name))
        self.cpu[name].append(cpu_seconds(self.pid) - cpu0)


SETTLE_MAX_S = 60.0
STEADY_S = 1.5  # longer than a used sandbox waits for its removal (sandbox/quiet.py)
LABEL_OWNER = "rlm-mcp.owner"  # the label the Docker backend gives every sandbox (its server's id)


def pool_ids(owner: str, pool: int) -> frozenset[str] | None:
    """The ids of `owner`'s sandboxes when they are `pool` running containers and nothing else."""
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    finally:
        client.close()
    if len(found) != pool or any(c["State"] != "running" for c in found):
        return None
    return frozenset(c["Id"] for c in found)


def compare(ideal: dict[str, float], after: Server, before: Server) -> None:
    """The two servers side by side (--before): wall ÷ ideal of each, and the median of the
    per-rep differences (each rep ran both, back to back)."""
    print(f"\n{'scenario':<14}{'before wall/ideal':<26}{'this wall/ideal':<26}{'this - before (median of pairs)':>32}")
    for name, walls in after.walls.items():
        base = ideal[name]
        cells = []
        for server in (before, after):
            ratios = [w / base for w in server.walls[name]]
            cells.append(f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
        pairs = [(a - b) * 1000 for a, b in zip(walls, before.walls[name], strict=True)]
        print(f"{name:<14}{cells[0]:<26}{cells[1]:<26}{statistics.median(pairs):>+28.1f} ms")


async def run_ours(client: Client, context_id: str, name: str) -> float:
    started = time.perf_counter()
    result = await client.call_tool(
        "rlm_complete", {"query": query_for(name), "context_id": context_id, "max_iterations": 30}
    )
    seconds = time.perf_counter() - started
    out: dict[str, Any] = result.structured_content or {}
    if out.get("answer") != "done":
        raise RuntimeError(f"rlm-mcp {name}: unexpected result {out!r}")
    return seconds


def report(
    args: argparse.Namespace,
    ideal: dict[str, float],
    ours: dict[str, list[float]],
    cpu: dict[str, list[float]],
    ref: dict[str, list[float]],
) -> None:
    out = ResultFile(
        "lm_time",
        "Wall ÷ ideal on a scripted LM with latency (ideal: the LM's critical path)",
        [
            "scenario",
            "ideal",
            "rlm-mcp wall ÷ ideal",
            "rlm-mcp overhead",
            "rlm-mcp server CPU",
            "reference wall ÷ ideal",
        ],
        note=(
            f"scripted LM: root {args.root_delay:g} s, sub {args.sub_delay:g} s per call, "
            f"{args.tokens_per_s:g} tokens/s, {args.concurrency} served at once; {args.reps} reps, "
            f"median [min, max]; big context {args.big_mib} MiB; warm pool {args.pool}, each run started once it was full again"
            + ("" if args.reference_python else "; reference not run (needs its venv and image: by hand)")
            + "; load average (1, 5, 15 min) "
            + " -> ".join("/".join(f"{x:.1f}" for x in load) for load in args.load)
        ),
    )
    print("\nload average (1, 5, 15 min) " + " -> ".join("/".join(f"{x:.1f}" for x in load) for load in args.load))
    print(
        f"{'scenario':<14}{'ideal':>9}  {'rlm-mcp wall/ideal':<26}{'overhead':>10}{'server CPU':>12}  "
        "reference wall/ideal"
    )
    for name, walls in ours.items():
        base = ideal[name]
        ratios = [w / base for w in walls]
        mine = f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"
        extra = f"{(statistics.median(walls) - base) * 1000:.0f} ms"
        theirs = "-"
        if ref[name]:
            rr = [w / base for w in ref[name]]
            theirs = f"{statistics.median(rr):.3f} [{min(rr):.3f}, {max(rr):.3f}]"
        used = f"{statistics.median(cpu[name]) * 1000:.0f} ms"
        print(f"{name:<14}{base:>8.2f}s  {mine:<26}{extra:>10}{used:>12}  {theirs}")
        out.add(name, f"{base:.2f} s", mine, extra, used, theirs)
    if args.record:
        print(f"written: {out.write()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--root-delay", type=float, default=0.5, help="seconds per root call (default 0.5)")
    parser.add_argument("--sub-delay", type=float, default=0.2, help="seconds per sub-call (default 0.2)")
    parser.add_argument("--tokens-per-s", type=float, default=100.0, help="decode rate (default 100)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests the LM serves at once (default 16)")
    parser.add_argument("--big-mib", type=int, default=50, help="size of the big context (smoke runs: small)")
    parser.add_argument(
        "--gap",
        type=float,
        default=0.5,
        help="idle seconds before each run, once the warm pool is full and steady (0: no wait at all)",
    )
    parser.add_argument("--pool", type=int, default=CHILDREN + 2, help=f"warm sandboxes (default {CHILDREN + 2})")
    parser.add_argument("--reference-python", default="", help="the reference's venv python: run it beside")
    parser.add_argument(
        "--only", nargs="+", choices=list(TRAJECTORIES), help="run only these scenarios (short runs while iterating)"
    )
    parser.add_argument("--server", default="", help="the rlm-mcp executable (default: this venv's)")
    parser.add_argument(
        "--before",
        default="",
        help="another checkout's rlm-mcp executable, run alternately with this one (A/B within one period)",
    )
    parser.add_argument("--record", action="store_true", help="write bench/results/lm_time.json")
    args = parser.parse_args(argv)
    if args.record and (args.only or args.server or args.before):
        parser.error("--record writes every scenario of this checkout: drop --only, --server and --before")
    if args.reference_python and not os.path.exists(args.reference_python):
        parser.error(f"no reference interpreter at {args.reference_python}")
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
