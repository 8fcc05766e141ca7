"""`bench/scale.py team`: team mode through HAProxy (issue 22 item 6). Run by hand.

Three replicas on one private PostgreSQL cluster (Debian's `postgresql` server binaries), behind
Debian's `haproxy` with the repository's configuration (`deploy/haproxy/haproxy.cfg`, TLS at the
balancer): `rlm1` and `rlm2` are `--role both` (the two workers), `rlm3` is `--role front`. The
LM is the zero-latency scripted server. Prints:

- server CPU per turn: the three replicas' CPU (user + system, from /proc) for `--runs` runs at
  once through the balancer (`--calls-to front`: to the front-only replica, which then follows
  every run while the workers only execute them), against one embedded process (SQLite, no
  queue) running the same runs at once (goal <= 1.3x); `--rounds K` measures K rounds of them in
  the same cluster and embedded process, alternating, and prints each round's ratio and load
  and their median (a round is a few seconds: one alone swings with the machine's load); each
  side's CPU is counted until its processes are idle again after its round's last call returned,
  less their idle rate (`--settle-s`: the sandboxes' removal and the pool's refill belong to the
  round that caused them); PostgreSQL's own CPU is printed beside it, not counted; also
  each replica's share (and of it, its event loop's thread: the rest is worker threads, Docker
  and kernel I/O; and the loop thread's context switches per turn, about its wake-ups), the
  same for the embedded process, PostgreSQL's transactions per turn, and each replica's idle CPU
  (no run, `--idle-s`; from the threads' scheduler statistics, not /proc's ticks) with the part of the figure it makes up; `--statements` lists
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
- from a worker's death (SIGKILL; the worker holding the most long runs, once each long run's
  first LM answer is recorded: a run killed before would be queued again) to its runs' final
  status (the lease is `--lease` s).

The machine's clocks are one clock (all processes on one host), so cross-process timestamps
compare. Never fails on a timing.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp import Client

from bench import procfs, team_cpu
from bench.procfs import cpu_seconds, tree_cpu
from bench.team_common import (
    TOKEN,
    Db,
    Embedded,
    call,
    client_of,
    complete,
    many_runs,
    ms,
    script,
    started_cluster,
    statements,
    team_env,
)
from bench.team_probes import cancel_latency, progress_latency, worker_death
from rlm_mcp.testing import scripted_lm_process
from tests.fixtures_haproxy import Balanced, balanced_replicas


@dataclass
class TeamSide:
    """The three replicas, set up and idle-measured once; `measure` is one round of `--runs` runs."""

    b: Balanced
    db: Db
    client: Client
    context_id: str
    pg_pid: int
    idle: dict[str, float]  # each replica's idle CPU per second (`team_cpu.Idle`)
    turns: int = 0
    xacts: int = 0
    wall: float = 0.0
    pg: float = 0.0
    deferred: float = 0.0  # CPU spent after the rounds' last calls returned (`team_cpu.settle`), summed
    spent: dict[str, float] = field(default_factory=dict)
    loops: dict[str, float] = field(default_factory=dict)
    wakes: dict[str, float] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)

    async def measure(self, args: argparse.Namespace, label: str, profiles: team_cpu.Profiles) -> float:
        """One round's server CPU per turn (the three replicas); adds to the totals over rounds."""
        replicas = self.b.replicas
        profiles.start({r.name: r.pid for r in replicas}, prefix=f"{label}-")
        xacts = await self.db.transactions()
        pg_before, before = tree_cpu(self.pg_pid), {r.name: cpu_seconds(r.pid) for r in replicas}
        loops = {r.name: procfs.loop_cpu_seconds(r.pid) for r in replicas}
        wakes = {r.name: procfs.loop_wakeups(r.pid) for r in replicas}
        t0 = time.perf_counter()
        self.run_ids += await many_runs(self.client, self.context_id, label, args.runs, followed=args.followed)
        self.wall += time.perf_counter() - t0
        turns = args.runs * args.turns
        returned = {r.name: cpu_seconds(r.pid) for r in replicas}
        after = await team_cpu.settle({r.name: r.pid for r in replicas}, self.idle, cap_s=args.settle_s)
        self.deferred += sum(after.values())
        spent = {r.name: returned[r.name] - before[r.name] + after[r.name] for r in replicas}
        for r in replicas:
            self.spent[r.name] = self.spent.get(r.name, 0.0) + spent[r.name]
            self.loops[r.name] = self.loops.get(r.name, 0.0) + procfs.loop_cpu_seconds(r.pid) - loops[r.name]
            self.wakes[r.name] = self.wakes.get(r.name, 0.0) + procfs.loop_wakeups(r.pid) - wakes[r.name]
        self.pg += tree_cpu(self.pg_pid) - pg_before
        self.xacts += await self.db.transactions() - xacts
        self.turns += turns
        profiles.stop()
        return sum(spent.values()) / turns


@dataclass
class EmbeddedSide:
    client: Client
    pid: int
    context_id: str
    idle: dict[str, float]  # its idle CPU per second (`team_cpu.Idle`)
    turns: int = 0
    cpu: float = 0.0
    loop: float = 0.0
    wakes: int = 0
    deferred: float = 0.0

    async def measure(self, args: argparse.Namespace, label: str, profiles: team_cpu.Profiles) -> float:
        profiles.start({"embedded": self.pid}, prefix=f"{label}-")
        pid = self.pid
        before, loop, wakes = cpu_seconds(pid), procfs.loop_cpu_seconds(pid), procfs.loop_wakeups(pid)
        await many_runs(self.client, self.context_id, label, args.runs, followed=args.followed)
        returned = cpu_seconds(pid)
        after = await team_cpu.settle({"embedded": pid}, self.idle, cap_s=args.settle_s)
        self.deferred += after["embedded"]
        spent = returned - before + after["embedded"]
        self.cpu += spent
        self.loop += procfs.loop_cpu_seconds(pid) - loop
        self.wakes += procfs.loop_wakeups(pid) - wakes
        self.turns += args.runs * args.turns
        profiles.stop()
        return spent / (args.runs * args.turns)


def team_report(args: argparse.Namespace, side: TeamSide, idle: team_cpu.Idle, pg_idle: float) -> dict[str, str]:
    """The team's figures over all measured rounds (their CPU summed, per turn)."""
    turns = side.turns
    spent = {n: v / turns for n, v in side.spent.items()}
    team_cpu_turn = sum(spent.values())
    calls = "every call to rlm3" if args.calls_to == "front" else "calls through HAProxy"
    rounds = f"; {args.rounds} rounds summed" if args.rounds > 1 else ""
    print(f"team mode: 3 replicas (both, both, front), {calls}; {args.runs} runs of {args.turns} turns at once{rounds}")
    print(
        f"  server CPU per turn {team_cpu_turn * 1000:.2f} ms (PostgreSQL beside it: {side.pg / turns * 1000:.2f} ms); "
        f"of it after the rounds' last calls returned: {side.deferred / turns * 1000:.2f} ms"
    )
    print(f"  PostgreSQL transactions per turn (each autocommit statement is one): {side.xacts / turns:.1f}")
    print(
        "  by replica (of which its event loop's thread): "
        + ", ".join(f"{n} {v * 1000:.2f} ms ({side.loops[n] / turns * 1000:.2f})" for n, v in spent.items())
    )
    print("  event loop context switches per turn: " + ", ".join(f"{n} {v / turns:.1f}" for n, v in side.wakes.items()))
    wall = side.wall / args.rounds
    idle_turn = idle.total() * side.wall / turns
    print(
        f"  idle, no run: {idle.render()} (PostgreSQL {pg_idle * 1000:.1f} ms/s); over a round's "
        f"{wall:.1f} s: {idle_turn * 1000:.2f} ms per turn ({idle_turn / team_cpu_turn:.0%} of the team's)"
    )
    return {
        "team": f"{team_cpu_turn * 1000:.2f} ms",
        "by_replica": " / ".join(f"{v * 1000:.2f}" for v in spent.values()),
        "postgres": f"{side.pg / turns * 1000:.2f} ms",
        "idle_share": f"{idle_turn * 1000:.2f} ms ({idle_turn / team_cpu_turn:.0%})",
        "wall": f"{wall:.1f} s",
        "transactions": f"{side.xacts / turns:.1f}",
    }


async def probes(args: argparse.Namespace, side: TeamSide, sequential: list[str]) -> None:
    db, b = side.db, side.b
    print(f"  runs per worker pid: {await db.workers_of(side.run_ids)}")
    print(f"  claim latency, {args.runs} runs at once: {ms(await db.claim_latencies(side.run_ids))}")
    print(f"  claim latency, one run at a time: {ms(await db.claim_latencies(sequential))}")
    async with client_of(b.replicas[2].base) as front:
        lags = await progress_latency(front, db, side.context_id, args.progress_runs)
    print(f"  progress latency (worker's turn_start -> front's notification): {ms(lags)}")
    answered, final = await cancel_latency(b, side.context_id, args.cancels)
    print(f"  cancel across replicas: rlm_cancel answered {ms(answered)}; status cancelled {ms(final)}")
    if args.death_runs < 1:  # a worker killed with nothing to stop proves nothing (and would kill the next round)
        return
    took, reasons = await worker_death(b, db, side.context_id, args.death_runs)
    print(f"  worker SIGKILLed -> its runs' final status (lease {args.lease:g} s): {ms(took)}")
    for reason in sorted(set(reasons)):
        print(f"    reason: {reason}")


async def team(args: argparse.Namespace, embedded: Embedded) -> None:
    """`embedded`: bench/scale.py's (server, server_env), passed in so this module does not import it back.

    Both sides are started once and stay up; `--rounds` measured rounds then alternate between
    them (embedded first in even rounds, team first in odd ones), each round's ratio its own."""
    print(f"machine: {os.cpu_count()} CPUs; load average {team_cpu.load_average()}")
    profiles = team_cpu.Profiles(args.py_spy, args.profile, args.py_spy_rate)
    figures: dict[str, str] = {"label": args.label, "load (start)": team_cpu.load_average()}
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlm-team-scale-")))
        lm_url = stack.enter_context(scripted_lm_process(script(args.turns)))
        (tmp / "embedded").mkdir()
        server, server_env = embedded  # bench/scale.py's: the embedded server, as its scale mode runs it
        env = server_env(lm_url, tmp / "embedded", f"bench-{secrets.token_hex(6)}", args.runs)
        env["RLM_MCP_POOL_SIZE"] = str(args.pool)
        e_client, e_pid = await stack.enter_async_context(server("http", env))
        e_context = (await call(e_client, "rlm_load_context", text="0123456789abcdef\n" * 4096))["context_id"]
        await many_runs(e_client, e_context, "warm-up", 4)
        e_idle = await team_cpu.Idle.measure({"embedded": e_pid}, args.idle_s)
        emb = EmbeddedSide(e_client, e_pid, e_context, e_idle.per_s)

        cluster = started_cluster(stack, statements=args.statements)
        (tmp / "team").mkdir()
        url = cluster.url()
        roles = ["both", "both", "front"]
        b = stack.enter_context(
            balanced_replicas(
                tmp / "team",
                database_url=url,
                lm_url=lm_url,
                tokens=[TOKEN],
                env={
                    **team_env(args.runs, args.pool, args.lease, args.live_summary_interval),
                    **dict(kv.split("=", 1) for kv in args.team_env),
                },
                roles=roles,
            )
        )
        # --calls-to front: every call to the front-only replica, so it follows all the runs and
        # the two workers only execute them (the front's following cost, and the workers', apart).
        t_url, cafile = (b.replicas[2].base, None) if args.calls_to == "front" else (b.url, b.cafile)
        t_client = await stack.enter_async_context(client_of(t_url, cafile=cafile))
        t_context = (await call(t_client, "rlm_load_context", text="0123456789abcdef\n" * 4096))["context_id"]
        await many_runs(t_client, t_context, "warm-up", 4)
        sequential = [await complete(t_client, t_context, f"scale run sequential {i}") for i in range(args.claims)]
        pids = {r.name: r.pid for r in b.replicas}
        pg_pid = cluster.proc.pid if cluster.proc else 0
        pg_idle = tree_cpu(pg_pid)
        profiles.start(pids, prefix="idle-")
        idle = await team_cpu.Idle.measure(pids, args.idle_s)
        profiles.stop()
        pg_idle = (tree_cpu(pg_pid) - pg_idle) / args.idle_s
        side = TeamSide(b, Db(url), t_client, t_context, pg_pid, idle.per_s)
        # Unmeasured rounds at full concurrency first, both sides alternating as the measured ones
        # do: the first one at that width pays one-off costs (the team's pools grow to it, its
        # statements get prepared) and the machine's load climbs from idle to the rounds' level;
        # measured from there, a first round read 0.1-0.2 above the others' ratio.
        for k in range(args.warm_rounds):
            for run_on in (emb, side) if k % 2 == 0 else (side, emb):
                await many_runs(run_on.client, run_on.context_id, f"warm-{k}", args.runs)
        # The measured rounds start from idle processes, as each of them ends (`team_cpu.settle`).
        await team_cpu.settle({"embedded": e_pid}, e_idle.per_s, cap_s=args.settle_s)
        await team_cpu.settle(pids, idle.per_s, cap_s=args.settle_s)
        if args.statements:
            await side.db.rows("SELECT pg_stat_statements_reset()")

        ratios: list[float] = []
        for k in range(args.rounds):
            load = team_cpu.load_average()
            if k % 2 == 0:
                e = await emb.measure(args, f"concurrent-e{k}", profiles)
                t = await side.measure(args, f"concurrent-t{k}", profiles)
            else:
                t = await side.measure(args, f"concurrent-t{k}", profiles)
                e = await emb.measure(args, f"concurrent-e{k}", profiles)
            ratios.append(t / e)
            if args.rounds > 1:
                print(
                    f"round {k + 1}/{args.rounds}: team {t * 1000:.2f} ms, embedded {e * 1000:.2f} ms per turn, "
                    f"ratio {t / e:.2f} (load {load})"
                )

        e_turn = emb.cpu / emb.turns
        print(
            f"embedded single process (SQLite, no queue): server CPU per turn {e_turn * 1000:.2f} ms "
            f"(its event loop's thread {emb.loop / emb.turns * 1000:.2f}, {emb.wakes // emb.turns} context switches "
            f"per turn; after the rounds' last calls returned {emb.deferred / emb.turns * 1000:.2f} ms) "
            f"(idle, no run: {e_idle.render()})"
        )
        figures["embedded"] = f"{e_turn * 1000:.2f} ms"
        figures.update(team_report(args, side, idle, pg_idle))
        if args.statements:
            print(await statements(side.db, side.turns))
        await probes(args, side, sequential)
    ratio = statistics.median(ratios)
    if args.rounds > 1:
        print(
            f"server CPU per turn, team / embedded: median {ratio:.2f} of {args.rounds} rounds "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}) (goal <= 1.3)"
        )
        figures["ratio"] = f"{ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f}, {args.rounds} rounds)"
    else:
        print(f"server CPU per turn, team / embedded: {ratio:.2f} (goal <= 1.3)")
        figures["ratio"] = f"{ratio:.2f}"
    print(f"load average at the end: {team_cpu.load_average()}")
    figures["load_end"] = team_cpu.load_average()
    if args.record:
        print(f"written: {team_cpu.record(figures)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="team: measured rounds of --runs runs in the same cluster and embedded process, alternating; "
        "the ratio printed is their median (with min and max)",
    )
    parser.add_argument(
        "--warm-rounds",
        type=int,
        default=1,
        help="team: unmeasured rounds of --runs runs on both sides, alternating, before the measured ones",
    )
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
    parser.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="team: after each side's round, the longest wait for its processes to be idle again, their CPU "
        "meanwhile (above the idle rate) counted with the round's (bench/team_cpu.py `settle`); 0: read at once",
    )
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
    parser.add_argument(
        "--team-env", nargs="*", default=[], help="team: more settings of the replicas, NAME=VALUE (not inherited)"
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
