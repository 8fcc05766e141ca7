"""What idle processes spend doing nothing: an idle team (two workers, one front-only replica, on
PostgreSQL, through HAProxy) and an idle embedded server. Run by hand.

    .venv/bin/python bench/team_idle.py [--idle-s 10] [--samples 3] [--hold 0]

Each process is started as `bench/scale.py team` starts it (the same settings, a lease of
`--lease` s), warmed by a few runs, then left alone: per process, its CPU (all its threads, from
their scheduler statistics) and its context switches (voluntary and not, all its threads: about its wake-ups) per
second over `--idle-s` seconds, `--samples` times. `--hold S`: keep the team up S seconds more
after the samples, printing the pids (for strace or py-spy by hand). Never fails on a timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import procfs, scale, team_common  # scale: the embedded server as its modes start it
from bench.team_cpu import load_average
from rlm_mcp.testing import scripted_lm_process
from tests.fixtures_haproxy import balanced_replicas


def switches(pid: int) -> dict[str, int]:
    """Context switches so far, by thread."""
    out: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{task}/status").read_text()
        except OSError:
            continue
        out[task] = sum(
            int(line.split()[1])
            for line in text.splitlines()
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        )
    return out


def switched(before: dict[str, int], after: dict[str, int]) -> int:
    """Switches between two samples; a thread that exited in between counts for none."""
    return sum(n - before.get(task, 0) for task, n in after.items())


async def measure(pids: dict[str, int], seconds: float) -> dict[str, tuple[float, float]]:
    # Each thread's scheduler statistics, not /proc's 10 ms ticks: an idle process spends a few
    # ms a second, which ticks read as anything from 0 to 6.
    cpu0 = {n: procfs.thread_cpu_ns(p) for n, p in pids.items()}
    sw0 = {n: switches(p) for n, p in pids.items()}
    t0 = time.perf_counter()
    await anyio.sleep(seconds)
    took = time.perf_counter() - t0
    return {
        n: (
            procfs.cpu_ns_between(cpu0[n], procfs.thread_cpu_ns(p)) / 1e6 / took,
            switched(sw0[n], switches(p)) / took,
        )
        for n, p in pids.items()
    }


def render(sample: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{n} {ms:.1f} ms/s {w:.0f} wakes/s" for n, (ms, w) in sample.items())


async def samples(pids: dict[str, int], args: argparse.Namespace) -> None:
    await anyio.sleep(args.settle)
    for _ in range(args.samples):
        print(f"  {render(await measure(pids, args.idle_s))} (load {load_average()})", flush=True)
    if args.hold:
        print(f"  holding {args.hold:g} s: pids {pids}", flush=True)
        await anyio.sleep(args.hold)


async def main_async(args: argparse.Namespace) -> None:
    print(f"machine: {os.cpu_count()} CPUs; load average {load_average()}")
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlm-team-idle-")))
        lm_url = stack.enter_context(scripted_lm_process(team_common.script(2)))
        if not args.team_only:
            (tmp / "embedded").mkdir()
            env = scale.server_env(lm_url, tmp / "embedded", "bench-idle", 4)
            async with scale.server("http", env) as (client, pid):
                context_id = (await team_common.call(client, "rlm_load_context", text="x" * 1000))["context_id"]
                await team_common.many_runs(client, context_id, "warm-up", 2)
                print("embedded server, idle:")
                await samples({"embedded": pid}, args)
        (tmp / "team").mkdir()
        cluster = team_common.started_cluster(stack, statements=args.statements)
        env = {"RLM_MCP_WORKER_LEASE_S": str(args.lease), "RLM_MCP_LOG_LEVEL": "WARNING", "RLM_MCP_POOL_SIZE": "2"}
        roles = ["both", "both", "front"]
        with balanced_replicas(
            tmp / "team", database_url=cluster.url(), lm_url=lm_url, tokens=[team_common.TOKEN], env=env, roles=roles
        ) as b:
            async with team_common.client_of(b.url, cafile=b.cafile) as client:
                context_id = (await team_common.call(client, "rlm_load_context", text="x" * 1000))["context_id"]
                await team_common.many_runs(client, context_id, "warm-up", 4)
            pids = {r.name: r.pid for r in b.replicas}
            print("team, idle (rlm1, rlm2 role both; rlm3 role front):")
            db = team_common.Db(cluster.url())
            if args.statements:
                await db.rows("SELECT pg_stat_statements_reset()")
            t0 = time.perf_counter()
            await samples(pids, args)
            if args.statements:  # per second of the whole idle wait, the three replicas together
                took = round(time.perf_counter() - t0)
                print(f"  statements over {took} s idle, per second (the three replicas together):")
                print(
                    (await team_common.statements(db, took, top=24)).replace("/turn", "/s   ").replace(" per turn", "")
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds per sample")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the warm-up before sampling")
    parser.add_argument("--lease", type=float, default=10.0, help="RLM_MCP_WORKER_LEASE_S")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to keep the team up after the samples")
    parser.add_argument("--team-only", action="store_true")
    parser.add_argument(
        "--statements", action="store_true", help="the team's statements while idle (pg_stat_statements)"
    )
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
