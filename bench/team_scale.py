"""`bench/scale.py team`: team mode through HAProxy (issue 22 item 6). Run by hand.

Three replicas on one private PostgreSQL cluster (Debian's `postgresql` server binaries), behind
Debian's `haproxy` with the repository's configuration (`deploy/haproxy/haproxy.cfg`, TLS at the
balancer): `rlm1` and `rlm2` are `--role both` (the two workers), `rlm3` is `--role front`. The
LM is the zero-latency scripted server. Prints:

- server CPU per turn: the three replicas' CPU (user + system, from /proc) for `--runs` runs at
  once through the balancer (`--calls-to front`: to the front-only replica, which then follows
  every run while the workers only execute them), against one embedded process (SQLite, no
  queue) running the same runs at once (goal <= 1.3x); PostgreSQL's own CPU is printed beside it, not counted; also
  each replica's share (and of it, its event loop's thread: the rest is worker threads, Docker
  and kernel I/O; and the loop thread's context switches per turn, about its wake-ups), the
  same for the embedded process, PostgreSQL's transactions per turn, and each replica's idle CPU
  (no run, `--idle-s`) with the part of the figure it makes up; `--statements` lists
  PostgreSQL's statements per turn (pg_stat_statements, preloaded by a restart of the bench's
  cluster); `--py-spy`/`--profile` add per-replica
  profile shares, `--record` appends the figures to bench/results/team_cpu.json (bench/team_cpu.py);
- how the runs spread over the two workers (their records name the worker);
- claim latency, from the run's row (`queued_at` -> `claimed_at`, the database's clock), p50 and
  p99, for the concurrent runs and for `--claims` runs one at a time (goal p50 <= 20 ms);
- progress latency across replicas: a client on the front-only replica, runs executing on the
  workers; from the worker's `turn_start` event (its timestamp) to the front's progress
  notification naming that turn;
- cancel latency across replicas: a run started through `rlm1`, cancelled through `rlm3`, its
  final status read through `rlm2`;
- from a worker's death (SIGKILL; the worker holding the most long runs) to its runs' final
  status (the lease is `--lease` s).

The machine's clocks are one clock (all processes on one host), so cross-process timestamps
compare. Never fails on a timing.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import team_cpu
from bench.team_common import (
    TOKEN,
    Db,
    Embedded,
    call,
    client_of,
    complete,
    cpu_seconds,
    many_runs,
    ms,
    script,
    started_cluster,
    statements,
    tree_cpu,
)
from bench.team_probes import cancel_latency, progress_latency, worker_death
from rlm_mcp.testing import scripted_lm_process
from tests.fixtures_haproxy import balanced_replicas
from tests.fixtures_postgres import Cluster


async def team_round(
    args: argparse.Namespace,
    tmp: Path,
    lm_url: str,
    cluster: Cluster,
    profiles: team_cpu.Profiles,
    figures: dict[str, str],
) -> float:
    url = cluster.url()
    db = Db(url)
    env = {
        "RLM_MCP_MAX_RUNS": str(args.runs // 2),
        "RLM_MCP_MAX_SANDBOXES": str(args.runs // 2 + 2),
        "RLM_MCP_POOL_SIZE": str(min(args.pool, args.runs // 2)),
        "RLM_MCP_WORKER_LEASE_S": str(args.lease),
        "RLM_MCP_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
        "RLM_MCP_RUN_MAX_QUEUED": "1000",
        "RLM_MCP_RUN_MAX_QUEUED_PER_OWNER": "1000",
    }
    if args.live_summary_interval is not None:  # 0: a live summary per progress event (before coalescing)
        env["RLM_MCP_LIVE_SUMMARY_INTERVAL_S"] = str(args.live_summary_interval)
    roles = ["both", "both", "front"]
    with balanced_replicas(tmp, database_url=url, lm_url=lm_url, tokens=[TOKEN], env=env, roles=roles) as b:
        # --calls-to front: every call to the front-only replica, so it follows all the runs and
        # the two workers only execute them (the front's following cost, and the workers', apart).
        url, cafile = (b.replicas[2].base, None) if args.calls_to == "front" else (b.url, b.cafile)
        async with client_of(url, cafile=cafile) as client:
            context_id = (await call(client, "rlm_load_context", text="0123456789abcdef\n" * 4096))["context_id"]
            await many_runs(client, context_id, "warm-up", 4)
            sequential = [await complete(client, context_id, f"scale run sequential {i}") for i in range(args.claims)]
            pids = {r.name: r.pid for r in b.replicas}
            pg_pid = cluster.proc.pid if cluster.proc else 0
            pg_idle = tree_cpu(pg_pid)
            profiles.start(pids, prefix="idle-")
            idle = await team_cpu.Idle.measure(pids, args.idle_s)
            profiles.stop()
            pg_idle = (tree_cpu(pg_pid) - pg_idle) / args.idle_s
            profiles.start(pids)
            xacts = await db.transactions()
            if args.statements:
                await db.rows("SELECT pg_stat_statements_reset()")
            pg_before, before = tree_cpu(pg_pid), {r.name: cpu_seconds(r.pid) for r in b.replicas}
            loops = {r.name: team_cpu.loop_cpu_seconds(r.pid) for r in b.replicas}
            wakes = {r.name: team_cpu.loop_wakeups(r.pid) for r in b.replicas}
            t0 = time.perf_counter()
            run_ids = await many_runs(client, context_id, "concurrent", args.runs, followed=args.followed)
            wall = time.perf_counter() - t0
            turns = args.runs * args.turns
            spent = {r.name: (cpu_seconds(r.pid) - before[r.name]) / turns for r in b.replicas}
            loops = {r.name: (team_cpu.loop_cpu_seconds(r.pid) - loops[r.name]) / turns for r in b.replicas}
            wakes = {r.name: (team_cpu.loop_wakeups(r.pid) - wakes[r.name]) / turns for r in b.replicas}
            team_cpu_turn = sum(spent.values())
            pg_cpu = (tree_cpu(pg_pid) - pg_before) / turns
            xacts = (await db.transactions() - xacts) / turns
            profiles.stop()
        calls = "every call to rlm3" if args.calls_to == "front" else "calls through HAProxy"
        print(f"team mode: 3 replicas (both, both, front), {calls}; {args.runs} runs of {args.turns} turns at once")
        print(f"  server CPU per turn {team_cpu_turn * 1000:.2f} ms (PostgreSQL beside it: {pg_cpu * 1000:.2f} ms)")
        print(f"  PostgreSQL transactions per turn (each autocommit statement is one): {xacts:.1f}")
        print(
            "  by replica (of which its event loop's thread): "
            + ", ".join(f"{n} {v * 1000:.2f} ms ({loops[n] * 1000:.2f})" for n, v in spent.items())
        )
        print("  event loop context switches per turn: " + ", ".join(f"{n} {v:.1f}" for n, v in wakes.items()))
        idle_turn = idle.total() * wall / turns
        print(
            f"  idle, no run: {idle.render()} (PostgreSQL {pg_idle * 1000:.1f} ms/s); over the round's "
            f"{wall:.1f} s: {idle_turn * 1000:.2f} ms per turn ({idle_turn / team_cpu_turn:.0%} of the team's)"
        )
        figures.update(
            team=f"{team_cpu_turn * 1000:.2f} ms",
            by_replica=" / ".join(f"{v * 1000:.2f}" for v in spent.values()),
            postgres=f"{pg_cpu * 1000:.2f} ms",
            idle_share=f"{idle_turn * 1000:.2f} ms ({idle_turn / team_cpu_turn:.0%})",
            wall=f"{wall:.1f} s",
            transactions=f"{xacts:.1f}",
        )
        if args.statements:
            print(await statements(db, turns))
        print(f"  runs per worker pid: {await db.workers_of(run_ids)}")
        print(f"  claim latency, {args.runs} runs at once: {ms(await db.claim_latencies(run_ids))}")
        print(f"  claim latency, one run at a time: {ms(await db.claim_latencies(sequential))}")
        async with client_of(b.replicas[2].base) as front:
            lags = await progress_latency(front, db, context_id, args.progress_runs)
        print(f"  progress latency (worker's turn_start -> front's notification): {ms(lags)}")
        answered, final = await cancel_latency(b, context_id, args.cancels)
        print(f"  cancel across replicas: rlm_cancel answered {ms(answered)}; status cancelled {ms(final)}")
        took, reasons = await worker_death(b, db, context_id, args.death_runs)
        print(f"  worker SIGKILLed -> its runs' final status (lease {args.lease:g} s): {ms(took)}")
        for reason in sorted(set(reasons)):
            print(f"    reason: {reason}")
    return team_cpu_turn


async def embedded_round(
    args: argparse.Namespace,
    tmp: Path,
    lm_url: str,
    embedded: Embedded,
    profiles: team_cpu.Profiles,
    figures: dict[str, str],
) -> float:
    server, server_env = embedded  # bench/scale.py's: the embedded server, as its scale mode runs it
    env = server_env(lm_url, tmp, f"bench-{secrets.token_hex(6)}", args.runs)
    env["RLM_MCP_POOL_SIZE"] = str(args.pool)
    async with server("http", env) as (client, pid):
        context_id = (await call(client, "rlm_load_context", text="0123456789abcdef\n" * 4096))["context_id"]
        await many_runs(client, context_id, "warm-up", 4)
        idle = await team_cpu.Idle.measure({"embedded": pid}, args.idle_s)
        profiles.start({"embedded": pid})
        before, loop, wakes = cpu_seconds(pid), team_cpu.loop_cpu_seconds(pid), team_cpu.loop_wakeups(pid)
        await many_runs(client, context_id, "concurrent", args.runs, followed=args.followed)
        per_turn = (cpu_seconds(pid) - before) / (args.runs * args.turns)
        loop = (team_cpu.loop_cpu_seconds(pid) - loop) / (args.runs * args.turns)
        wakes = (team_cpu.loop_wakeups(pid) - wakes) // (args.runs * args.turns)
        profiles.stop()
    print(
        f"embedded single process (SQLite, no queue): server CPU per turn {per_turn * 1000:.2f} ms "
        f"(its event loop's thread {loop * 1000:.2f}, {wakes} context switches per turn) "
        f"(idle, no run: {idle.render()})"
    )
    figures["embedded"] = f"{per_turn * 1000:.2f} ms"
    return per_turn


async def team(args: argparse.Namespace, embedded: Embedded) -> None:
    """`embedded`: bench/scale.py's (server, server_env), passed in so this module does not import it back."""
    print(f"machine: {os.cpu_count()} CPUs; load average {team_cpu.load_average()}")
    profiles = team_cpu.Profiles(args.py_spy, args.profile, args.py_spy_rate)
    figures: dict[str, str] = {"label": args.label, "load (start)": team_cpu.load_average()}
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlm-team-scale-")))
        lm_url = stack.enter_context(scripted_lm_process(script(args.turns)))
        (tmp / "embedded").mkdir()
        per_turn = await embedded_round(args, tmp / "embedded", lm_url, embedded, profiles, figures)
        cluster = started_cluster(stack, statements=args.statements)
        (tmp / "team").mkdir()
        team_cpu_turn = await team_round(args, tmp / "team", lm_url, cluster, profiles, figures)
    print(f"server CPU per turn, team / embedded: {team_cpu_turn / per_turn:.2f} (goal <= 1.3)")
    print(f"load average at the end: {team_cpu.load_average()}")
    figures.update(ratio=f"{team_cpu_turn / per_turn:.2f}", load_end=team_cpu.load_average())
    if args.record:
        print(f"written: {team_cpu.record(figures)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", type=int, default=20, help="team: runs one at a time for the idle claim latency")
    parser.add_argument("--lease", type=float, default=10.0, help="team: RLM_MCP_WORKER_LEASE_S")
    parser.add_argument("--progress-runs", type=int, default=4, help="team: runs followed from the front")
    parser.add_argument("--cancels", type=int, default=5, help="team: runs cancelled across replicas")
    parser.add_argument(
        "--live-summary-interval",
        type=float,
        default=None,
        help="team: RLM_MCP_LIVE_SUMMARY_INTERVAL_S of the replicas (default: the setting's default)",
    )
    parser.add_argument("--idle-s", type=float, default=10.0, help="team: idle seconds measured before the round")
    parser.add_argument("--py-spy", default=None, help="team: a py-spy binary (outside the project) to profile with")
    parser.add_argument("--profile", type=Path, default=None, help="team: folder for py-spy's raw stacks")
    parser.add_argument("--py-spy-rate", type=int, default=40, help="team: py-spy's samples per second")
    parser.add_argument(
        "--statements", action="store_true", help="team: list PostgreSQL's statements per turn (pg_stat_statements)"
    )
    parser.add_argument(
        "--followed",
        action="store_true",
        help="team: the measured runs' calls ask for progress (a progress token), so every run is followed "
        "(both modes); without it nobody follows them",
    )
    parser.add_argument("--label", default="", help="team: this run's label in the recorded row (before, after)")
    parser.add_argument("--record", action="store_true", help="team: append this run to bench/results/team_cpu.json")
    parser.add_argument("--death-runs", type=int, default=4, help="team: long runs when a worker is killed")
    parser.add_argument(
        "--calls-to",
        choices=["balancer", "front"],
        default="balancer",
        help="team: where the bench's calls go: HAProxy (each replica fronts some runs) or the front-only replica (rlm3)",
    )
