"""Team mode's CPU split into a run's own part and each turn's part. Run by hand.

    .venv/bin/python bench/team_perrun.py [--runs 32] [--short 10] [--long 30] [--pairs 3]

The same setting as `bench/scale.py team` (three replicas behind HAProxy, rlm1 and rlm2 the
workers, rlm3 front-only, on a private PostgreSQL cluster; the embedded process beside it), but
in one cluster and one embedded process the bench alternates rounds of `--runs` runs at once of
`--short` turns each and of `--long` turns each, `--pairs` times. Each round's CPU (user +
system, from /proc) is one point of CPU = per_run * runs + per_turn * turns; the least-squares
fit over the rounds gives each process's CPU per run (its start and end: the enqueue, the claim,
the context's pins, the final record, the front following it) and per turn (the LM call, the
cell, the run log's events), for the team (by replica) and for the embedded process. The figure
of `bench/scale.py team` is per_run / turns_per_run + per_turn. `--strace DIR` counts each event
loop's system calls per run, `--loop-callbacks DIR` its callbacks by what they resume
(bench/loop_hook). Never fails on a timing.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/scale.py imports team_scale beside it

from bench import procfs, scale, team_cpu  # scale: the embedded server, as its scale mode runs it
from bench.procfs import cpu_seconds
from bench.team_common import DONE, TOKEN, TURN, Db, call, many_runs, started_cluster, statements, team_env
from rlm_mcp.testing import scripted_lm_process
from tests.fixtures_haproxy import balanced_replicas

Sample = dict[str, float]  # process name -> CPU seconds


def script(short: int, long: int) -> dict[str, Any]:
    return {
        "max_model_len": 65536,
        "sub_default": "ok",
        "root_by_query": [
            {"match": "perrun long", "replies": [TURN] * (long - 1) + [DONE]},
            {"match": "scale run", "replies": [TURN] * (short - 1) + [DONE]},
        ],
    }


def fit(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of cpu = a * runs + b * turns through the origin: (a, b)."""
    srr = sum(r * r for r, _, _ in points)
    stt = sum(t * t for _, t, _ in points)
    srt = sum(r * t for r, t, _ in points)
    src = sum(r * c for r, _, c in points)
    stc = sum(t * c for _, t, c in points)
    det = srr * stt - srt * srt
    return (src * stt - stc * srt) / det, (stc * srr - src * srt) / det


class Straces:
    """`strace -c` on each process's main thread (its event loop) while the rounds run: the
    system calls it makes per run (counts only; the CPU figures of such a run are not valid)."""

    def __init__(self, folder: Path | None) -> None:
        self._folder = folder
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, pids: dict[str, int]) -> None:
        if self._folder is None:
            return
        self._folder.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            argv = ["strace", "-c", "-o", str(self._folder / f"{name}.txt"), "-p", str(pid)]
            self._procs[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached

    def stop(self, runs: int) -> None:
        for proc in self._procs.values():
            proc.send_signal(signal.SIGINT)
        for name, proc in self._procs.items():
            proc.wait(timeout=30)
            assert self._folder is not None
            print(f"  {name}: system calls of its event loop's thread per run ({runs} runs)")
            for line in (self._folder / f"{name}.txt").read_text().splitlines()[2:]:
                parts = line.split()
                if len(parts) >= 5 and parts[3].isdigit() and parts[-1] != "total":
                    print(f"    {int(parts[3]) / runs:8.1f}  {parts[-1]}")
        self._procs = {}


HOOK = Path(__file__).resolve().parent / "loop_hook"  # its sitecustomize counts a loop's callbacks


class LoopCallbacks:
    """Each process's event-loop callbacks per run while the rounds run, by what they resume
    (bench/loop_hook/sitecustomize.py, loaded by the servers through PYTHONPATH)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._pids: dict[str, int] = {}

    def env(self) -> dict[str, str]:
        if self.folder is None:
            return {}
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {"PYTHONPATH": str(HOOK), "RLM_BENCH_LOOP_HOOK_DIR": str(self.folder)}
        # Both sides alike, when set in the bench's own environment.
        for name in (
            "RLM_BENCH_LOOP_HOOK_DEPTH",
            "RLM_BENCH_LOOP_HOOK_TOP",
            "RLM_BENCH_LOOP_HOOK_CPU",
            "RLM_BENCH_LOOP_HOOK_PROFILE",
        ):
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def start(self, pids: dict[str, int]) -> None:
        if self.folder is None:
            return
        self._pids = pids
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR2)

    def stop(self, runs: int, top: int = 30) -> None:
        for name, pid in self._pids.items():
            assert self.folder is not None
            out = self.folder / f"{pid}.txt"
            out.unlink(missing_ok=True)
            os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.2)  # written
            print(f"  {name}: event-loop callbacks per run ({runs} runs)")
            for line in out.read_text().splitlines()[: top + 1]:
                n, _, what = line.partition(" ")
                print(f"    {int(n) / runs:7.2f}  {what[:160]}")
        self._pids = {}


async def rounds(
    args: argparse.Namespace,
    pids: dict[str, int],
    go: Callable[[str, int], Awaitable[Any]],
) -> dict[str, list[tuple[float, float, float]]]:
    """Alternate short and long rounds; per process, (runs, turns, CPU seconds) of each, and of
    each process's event-loop thread alone (`NAME loop`)."""
    points: dict[str, list[tuple[float, float, float]]] = {
        name: [] for name in [*pids, "all", *(f"{n} loop" for n in pids)]
    }
    order = [("short", args.short), ("long", args.long)] if args.long else [("short", args.short)]
    for pair in range(args.pairs):
        for label, turns in order if pair % 2 == 0 else order[::-1]:
            before = {n: cpu_seconds(p) for n, p in pids.items()}
            loop_before = {n: procfs.loop_cpu_seconds(p) for n, p in pids.items()}
            t0 = time.perf_counter()
            await go(label, pair)
            wall = time.perf_counter() - t0
            spent = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
            spent["all"] = sum(spent.values())
            spent |= {f"{n} loop": procfs.loop_cpu_seconds(p) - loop_before[n] for n, p in pids.items()}
            for n, v in spent.items():
                points[n].append((args.runs, args.runs * turns, v))
            by = ", ".join(f"{n} {v * 1000 / (args.runs * turns):.2f}" for n, v in spent.items())
            print(f"    {label:5} ({turns:3} turns) {wall:5.1f} s, ms per turn: {by}  load {team_cpu.load_average()}")
    return points


def report(what: str, points: dict[str, list[tuple[float, float, float]]], args: argparse.Namespace) -> None:
    if not args.long:  # no fit: CPU per run
        for name, pts in points.items():
            print(f"  {what} {name:8}: {sum(c for _, _, c in pts) * 1000 / sum(r for r, _, _ in pts):6.2f} ms per run")
        return
    for name, pts in points.items():
        per_run, per_turn = fit(pts)
        print(
            f"  {what} {name:8}: per run {per_run * 1000:6.2f} ms, per turn {per_turn * 1000:5.2f} ms "
            f"(at {args.short} turns a run: {per_run * 1000 / args.short:.2f} + {per_turn * 1000:.2f} ms per turn)"
        )


async def runs_of(client: Any, context_id: str, label: str, pair: int, count: int) -> None:
    if label == "short":
        await many_runs(client, context_id, f"p{pair}", count)
    else:
        await many_runs(client, context_id, f"x perrun long p{pair}", count)


async def embedded(args: argparse.Namespace, tmp: Path, lm_url: str) -> None:
    env = scale.server_env(lm_url, tmp, f"bench-{secrets.token_hex(6)}", args.runs)
    env["RLM_MCP_POOL_SIZE"] = str(args.pool)
    hook = LoopCallbacks(args.loop_callbacks / "embedded" if args.loop_callbacks else None)
    env.update(hook.env())
    async with scale.server("http", env) as (client, pid):
        context_id = (await call(client, "rlm_load_context", text="0123456789abcdef\n" * 4096))["context_id"]
        await many_runs(client, context_id, "warm-up", 4)
        print("embedded (SQLite, no queue):")
        profiles = team_cpu.Profiles(args.py_spy, args.profile, args.py_spy_rate)
        profiles.start({"embedded": pid})
        straces = Straces(args.strace / "embedded" if args.strace else None)
        straces.start({"embedded": pid})
        hook.start({"embedded": pid})
        points = await rounds(
            args, {"embedded": pid}, lambda label, pair: runs_of(client, context_id, label, pair, args.runs)
        )
        straces.stop(int(sum(r for r, _, _ in points["embedded"])))
        hook.stop(int(sum(r for r, _, _ in points["embedded"])))
        profiles.stop()
    report("embedded", {n: points[n] for n in ("embedded", "embedded loop")}, args)


async def team(args: argparse.Namespace, tmp: Path, lm_url: str, stack: AsyncExitStack) -> None:
    cluster = started_cluster(stack, statements=args.statements)
    url = cluster.url()
    db = Db(url)
    env = {**team_env(args.runs, args.pool, args.lease), **dict(kv.split("=", 1) for kv in args.team_env)}
    hook = LoopCallbacks(args.loop_callbacks / "team" if args.loop_callbacks else None)
    env.update(hook.env())
    with balanced_replicas(
        tmp, database_url=url, lm_url=lm_url, tokens=[TOKEN], env=env, roles=["both", "both", "front"]
    ) as b:
        async with scale_client(b, calls_to=args.calls_to) as client:
            context_id = (await call(client, "rlm_load_context", text="0123456789abcdef\n" * 4096))["context_id"]
            await many_runs(client, context_id, "warm-up", 4)
            pids = {r.name: r.pid for r in b.replicas}
            print("team (rlm1, rlm2 both; rlm3 front):")
            if args.statements:
                await db.rows("SELECT pg_stat_statements_reset()")
            profiles = team_cpu.Profiles(args.py_spy, args.profile, args.py_spy_rate)
            profiles.start(pids)
            straces = Straces(args.strace / "team" if args.strace else None)
            straces.start(pids)
            hook.start(pids)
            points = await rounds(args, pids, lambda label, pair: runs_of(client, context_id, label, pair, args.runs))
            straces.stop(int(sum(r for r, _, _ in points["all"])))
            hook.stop(int(sum(r for r, _, _ in points["all"])))
            profiles.stop()
            if args.statements:
                total_turns = int(sum(t for _, t, _ in points["all"]))
                print(await statements(db, total_turns))
    report("team", points, args)


def scale_client(b: Any, *, calls_to: str) -> Any:
    """Through HAProxy, or straight to the front-only replica (`front`, which then fronts every
    run), or to the first `both` replica (`worker`: its own worker has room for each run, so every
    run takes the local lane)."""
    from bench.team_common import client_of

    if calls_to == "front":
        return client_of(b.replicas[2].base)
    if calls_to == "worker":
        return client_of(b.replicas[0].base)
    return client_of(b.url, cafile=b.cafile)


async def main_async(args: argparse.Namespace) -> None:
    print(f"machine: {os.cpu_count()} CPUs; load average {team_cpu.load_average()}")
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlm-team-perrun-")))
        lm_url = stack.enter_context(scripted_lm_process(script(args.short, args.long)))
        for side in args.sides:
            (tmp / side).mkdir()
            if side == "embedded":
                await embedded(args, tmp / side, lm_url)
            else:
                await team(args, tmp / side, lm_url, stack)
    print(f"load average at the end: {team_cpu.load_average()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=32, help="runs at once in each round (team: over two workers)")
    parser.add_argument("--short", type=int, default=10, help="turns per run in the short rounds")
    parser.add_argument(
        "--long", type=int, default=30, help="turns per run in the long rounds (0: none, CPU per run only)"
    )
    parser.add_argument("--pairs", type=int, default=3, help="short and long rounds, alternated")
    parser.add_argument("--pool", type=int, default=4, help="warm pool size")
    parser.add_argument("--lease", type=float, default=3.0, help="team: RLM_MCP_WORKER_LEASE_S")
    parser.add_argument("--statements", action="store_true", help="team: PostgreSQL's statements per turn")
    parser.add_argument("--py-spy", default=None, help="a py-spy binary (outside the project) to profile with")
    parser.add_argument("--profile", type=Path, default=None, help="folder for py-spy's raw stacks")
    parser.add_argument("--py-spy-rate", type=int, default=100, help="py-spy's samples per second")
    parser.add_argument(
        "--calls-to",
        choices=["balancer", "front", "worker"],
        default="balancer",
        help="team: calls through HAProxy, or all to rlm3 (the front's CPU per run apart from the workers'), "
        "or all to rlm1 (a `both` replica: the local lane's path, with --runs within its run slots)",
    )
    parser.add_argument(
        "--strace", type=Path, default=None, help="folder: count each event loop's system calls (strace -c)"
    )
    parser.add_argument(
        "--loop-callbacks",
        type=Path,
        default=None,
        help="folder: count each event loop's callbacks per run by what they resume (bench/loop_hook; "
        "the CPU figures of such a run are not valid)",
    )
    parser.add_argument("--team-env", nargs="*", default=[], help="team: more settings of the replicas, NAME=VALUE")
    parser.add_argument("--sides", nargs="+", default=["embedded", "team"], choices=["embedded", "team"])
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
