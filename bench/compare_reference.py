"""Side by side: the reference library (`rlms` 0.1.3, its DockerREPL) and rlm-mcp over MCP stdio,
against the same zero-latency scripted LM server, same scenarios, same contexts, reps interleaved.

By hand only (it needs the reference's own environment and image):

    python3 -m venv /work/rlms-venv && /work/rlms-venv/bin/pip install rlms==0.1.3 openai==2.14.0
    .venv/bin/python bench/compare_reference.py --reference-python /work/rlms-venv/bin/python [--reps 3]

The reference image (`rlm-bench-reference:0.1.3`) is built offline on first use from
bench/reference/Dockerfile: the project's Debian base with the packages the reference
pip-installs in every container (dill, requests) already installed, from wheels that the
reference's pip downloads on the host. `--ours-only` measures rlm-mcp alone.

Scenarios (each a whole `rlm_complete` / `RLM.completion`):
  one_1k     1 turn on 1 KiB                 one_1m     1 turn on 1 MiB
  ten_1m     10 turns of print(len(context)) on 1 MiB
  batch_1m   5 turns of a 16-way llm_query_batched, then the answer turn, on 1 MiB
  one_50m    1 turn on 50 MiB                five_50m   5 turns on 50 MiB
`--settle-s S`: before each timed run (either side's), wait until the host's CPUs are quiet (S
seconds at most), so neither side's run meets the clean-up of the other's last one. Off by default:
tried once, it did not make rlm-mcp's figures steadier (bench/results/compare-settle-2026-12-03.md).

Derived, per rep: further turn = (ten_1m - one_1m) / 9; sub-call = (batch_1m - one_1m - 5 turns) / 80;
turn at 50 MiB = (five_50m - one_50m) / 4. Prints medians, min/max and reference/ours ratios.

Measured, per rep: further turn = the median of the nine intervals between one root request's
arrival at the scripted server and the next within one ten_1m run (its request log), which is
what the derived figure estimates (an LM reply, the cell, the next request), taken inside one run
instead of as the difference of two whole runs' wall times. The scripted server appends each
request to its log before answering it, the same work in every turn for both sides.

`--server PATH` runs another checkout's `rlm-mcp` (e.g. an older tree's venv) against this
bench, alternating trees within one period; `--only NAME...` runs some scenarios (no derived
figures that need the others); `--record` writes bench/results/compare_reference.json.
Never fails on a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench's own modules
from bench.compare_figures import RequestLog, cpu_per_turn, derive, fmt, report, turn_intervals
from bench.procfs import children_named, cpu_snapshot, host_busy_share, host_cpu_ticks, peak_rss_mb, process_groups
from rlm_mcp.testing import scripted_lm_process

HERE = Path(__file__).resolve().parent
REFERENCE_IMAGE = "rlm-bench-reference:0.1.3"
MODEL = "rlm-v0.1"

TURN = "```repl\nprint(len(context))\n```"
BATCH = '```repl\nr = llm_query_batched(["q%d" % i for i in range(16)])\nprint(len(r))\n```'
DONE = '```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```'

# name -> (context, root replies)
SCENARIOS: dict[str, tuple[str, list[str]]] = {
    "one_1k": ("1k", [DONE]),
    "one_1m": ("1m", [DONE]),
    "ten_1m": ("1m", [TURN] * 9 + [DONE]),
    "batch_1m": ("1m", [BATCH] * 5 + [DONE]),
    "one_50m": ("50m", [DONE]),
    "five_50m": ("50m", [TURN] * 4 + [DONE]),
}
SIZES = {"1k": 1 << 10, "1m": 1 << 20, "50m": 50 << 20}  # "50m" follows --big-mib (a smoke run uses less)


def query_for(name: str) -> str:
    return f"bench scenario {name}: answer done"


def script() -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_model_len": 65536,
        "root_by_query": [
            {"match": f"scenario {name}:", "replies": replies} for name, (_, replies) in SCENARIOS.items()
        ],
        "sub_default": "ok",
    }


def write_contexts(folder: Path) -> dict[str, Path]:
    line = "0123456789abcdef" * 4 + "\n"
    paths = {}
    for key, size in SIZES.items():
        path = folder / f"context_{key}.txt"
        with path.open("w", encoding="utf-8") as fh:
            fh.write(line * (size // len(line)))
            fh.write("x" * (size % len(line)))
        paths[key] = path
    return paths


def scripted_lm(python: str, log: Path, folder: Path) -> AbstractContextManager[str]:
    """The scripted LM in a subprocess: this checkout's, or with `python` another checkout's
    venv running its own, from `folder` and on the script as this bench writes it."""
    if not python:
        return scripted_lm_process(script(), log_path=log)
    script_file = folder / "script.json"
    script_file.write_text(json.dumps(script()), encoding="utf-8")
    return scripted_lm_process(script_file, log_path=log, python=python, cwd=folder)


# --- the reference -------------------------------------------------------------------------
def ensure_reference_image(reference_python: str) -> None:
    if subprocess.run(["docker", "image", "inspect", REFERENCE_IMAGE], capture_output=True).returncode == 0:
        return
    with tempfile.TemporaryDirectory(prefix="rlm-bench-ref-") as tmp:
        wheels = Path(tmp) / "wheels"
        subprocess.run(
            [
                str(Path(reference_python).parent / "pip"),
                "download",
                "-q",
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux2014_x86_64",
                "-d",
                str(wheels),
                "pip",
                "dill",
                "requests",
            ],
            check=True,
        )
        shutil.copy(HERE / "reference" / "Dockerfile", Path(tmp) / "Dockerfile")
        subprocess.run(["docker", "build", "--network", "none", "-q", "-t", REFERENCE_IMAGE, tmp], check=True)


class Reference:
    """The reference library in its own interpreter, fed one scenario at a time."""

    def __init__(self, python: str, base_url: str, workdir: Path) -> None:
        self.proc = subprocess.Popen(
            [python, str(HERE / "reference" / "driver.py"), base_url, REFERENCE_IMAGE, MODEL],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=workdir,
        )
        self.peak_rss_mb = 0.0

    def run(self, name: str, context: Path) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"query": query_for(name), "context_file": str(context)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference driver died (exit {self.proc.wait()})")
        out = json.loads(line)
        if out["answer"] != "done":
            raise RuntimeError(f"reference {name}: unexpected answer {out['answer']!r}")
        self.peak_rss_mb = max(self.peak_rss_mb, out["peak_rss_mb"])
        return float(out["seconds"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- rlm-mcp over stdio ----------------------------------------------------------------------
def server_env(base_url: str, data_dir: Path, root: Path) -> dict[str, str]:
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "RLM_MCP_BASE_URL": base_url,
        "RLM_MCP_MODEL": MODEL,
        "RLM_MCP_DATA_DIR": str(data_dir),
        "RLM_MCP_ALLOWED_ROOTS": str(root),
        "RLM_MCP_POOL_SIZE": "2",
        "RLM_MCP_LOG_LEVEL": "WARNING",
        "RLM_MCP_INSTANCE_ID": f"bench-{secrets.token_hex(6)}",
    }
    if "DOCKER_HOST" in os.environ:
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    # The bench's own RLM_MCP_* settings win (e.g. an older tree's server given this image).
    env.update({k: v for k, v in os.environ.items() if k.startswith("RLM_MCP_")})
    return env


class Ours:
    def __init__(self, client: Client, context_ids: dict[str, str]) -> None:
        self.client = client
        self.context_ids = context_ids

    async def run(self, name: str) -> float:
        key = SCENARIOS[name][0]
        started = time.perf_counter()
        result = await self.client.call_tool(
            "rlm_complete", {"query": query_for(name), "context_id": self.context_ids[key], "max_iterations": 30}
        )
        seconds = time.perf_counter() - started
        out = result.structured_content or {}
        if not out and result.content:  # an older server answers the record as JSON text only
            out = json.loads(getattr(result.content[0], "text", "") or "{}")
        if out.get("answer") != "done":
            raise RuntimeError(f"rlm-mcp {name}: unexpected result {out!r}")
        return seconds


@dataclass
class Gathered:
    """Per-scenario times of each side, the measured turns (a median per rep), and CPU per run."""

    ours: dict[str, list[float]]
    ref: dict[str, list[float]]
    turns_ours: list[float] = field(default_factory=list)
    turns_ref: list[float] = field(default_factory=list)
    cpu_ns: dict[str, list[dict[str, int]]] = field(default_factory=lambda: {"one_1m": [], "ten_1m": []})
    settled_s: list[float] = field(default_factory=list)  # each timed run's wait for a quiet host


async def quiet_host(cap_s: float, *, busy_below: float = 0.1, step_s: float = 0.25) -> float:
    """Wait until the host's CPUs are quiet (under `busy_below` of them busy over two steps in a
    row) or `cap_s` has passed; the seconds waited.

    Interleaved, each side's run starts while the other's last one is still being cleaned up (the
    reference removes its container at the end of each completion; rlm-mcp refills its warm pool),
    and that work lands on whichever side runs next. Both sides wait for it alike."""
    started = time.perf_counter()
    quiet = 0
    before = host_cpu_ticks()
    while quiet < 2 and time.perf_counter() - started < cap_s:
        await anyio.sleep(step_s)
        now = host_cpu_ticks()
        quiet = quiet + 1 if host_busy_share(before, now) < busy_below else 0
        before = now
    return time.perf_counter() - started


async def run_reps(
    args: argparse.Namespace, ours: Ours, reference: Reference | None, log: RequestLog, paths: dict[str, Path]
) -> Gathered:
    chosen = args.only or list(SCENARIOS)
    got = Gathered({name: [] for name in chosen}, {name: [] for name in chosen})
    (server_pid,) = children_named(os.getpid(), Path(args.server_bin).name)
    (lm_pid,) = children_named(os.getpid(), "rlm_mcp.testing.scripted_lm")
    for rep in range(args.reps):
        for name in chosen:
            if reference is None:
                # Back to back, each run would find the pool still refilling from the last
                # (interleaved, the reference's seconds-long run gives it time).
                await anyio.sleep(args.gap)
            got.settled_s.append(await quiet_host(args.settle_s))
            log.since_last()
            groups = process_groups(server_pid, lm_pid) if name in got.cpu_ns else {}
            before = cpu_snapshot(groups)
            got.ours[name].append(await ours.run(name))
            if groups:
                after = cpu_snapshot(groups)
                got.cpu_ns[name].append({k: after[k] - before[k] for k in groups})
            if name == "ten_1m":
                gaps = turn_intervals(log.since_last())
                got.turns_ours.append(statistics.median(gaps))
                if args.verbose:
                    print("turns (ms):", " ".join(f"{g * 1000:.1f}" for g in gaps), file=sys.stderr)
            if reference is not None:
                got.settled_s.append(await quiet_host(args.settle_s))
                got.ref[name].append(await anyio.to_thread.run_sync(reference.run, name, paths[SCENARIOS[name][0]]))
                if name == "ten_1m":
                    got.turns_ref.append(statistics.median(turn_intervals(log.since_last())))
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    return got


async def main_async(args: argparse.Namespace) -> None:
    SIZES["50m"] = args.big_mib << 20
    if args.big_mib != 50:
        print(f"note: the '50 MiB' rows use a {args.big_mib} MiB context", file=sys.stderr)
    if not args.ours_only:
        ensure_reference_image(args.reference_python)
    args.server_bin = args.server or str(Path(sys.executable).parent / "rlm-mcp")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        paths = write_contexts(tmp)
        log = RequestLog(tmp / "requests.jsonl")
        with scripted_lm(args.lm_python, log.path, tmp) as url:
            env = server_env(url, tmp / "data", tmp)
            params = StdioServerParameters(command=args.server_bin, args=[], env=env)
            reference = None if args.ours_only else Reference(args.reference_python, url, tmp)
            try:
                async with Client(params) as client:
                    ids: dict[str, str] = {}
                    load_s: dict[str, float] = {}
                    for key, path in paths.items():
                        started = time.perf_counter()
                        handle = await client.call_tool("rlm_load_context", {"path": str(path)})
                        load_s[key] = time.perf_counter() - started
                        ids[key] = (handle.structured_content or {})["context_id"]
                    ours = Ours(client, ids)
                    await ours.run("one_1k")  # warm-up: pool filled, model discovered
                    got = await run_reps(args, ours, reference, log, paths)
                    servers = children_named(os.getpid(), Path(args.server_bin).name)
                    server_peak = max((peak_rss_mb(pid) for pid in servers), default=0.0)
            finally:
                if reference is not None:
                    reference.close()
    args.load = (load_before, os.getloadavg())
    docker = await anyio.run_process(["docker", "--version"])
    print(
        f"machine: {os.cpu_count()} CPUs, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB; "
        f"{docker.stdout.decode().strip()}; server {args.server_bin}"
    )
    print(
        f"rlm-mcp: rlm_load_context of a file: 1 KiB {fmt(load_s['1k'])}, 1 MiB {fmt(load_s['1m'])}, "
        f"50 MiB {fmt(load_s['50m'])}; server peak RSS {server_peak:.0f} MB"
    )
    if reference is not None:
        print(f"reference: driver peak RSS {reference.peak_rss_mb:.0f} MB")
    if args.settle_s > 0:
        waits = got.settled_s
        capped = sum(1 for w in waits if w >= args.settle_s)
        print(
            f"waits for a quiet host before each timed run: median {fmt(statistics.median(waits))}, "
            f"max {fmt(max(waits))}, {capped} of {len(waits)} at the {args.settle_s:g} s cap"
        )
    ref = None if reference is None else derive(got.ref, got.turns_ref)
    report(args, derive(got.ours, got.turns_ours), ref, cpu_per_turn(got.cpu_ns))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--reference-python", default="/work/rlms-venv/bin/python")
    parser.add_argument("--ours-only", action="store_true")
    parser.add_argument(
        "--gap",
        type=float,
        default=1.5,
        help="--ours-only: idle seconds before each run, so the warm pool is full (default 1.5)",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="before each timed run (either side's), the longest wait for the host's CPUs to be quiet "
        "(under a tenth busy), so neither side's run meets the other's clean-up; 0: no wait (the default)",
    )
    parser.add_argument("--big-mib", type=int, default=50, help="size of the big context (smoke runs: small)")
    parser.add_argument("--server", default="", help="the rlm-mcp executable (default: this venv's)")
    parser.add_argument(
        "--lm-python", default="", help="run the scripted LM of this interpreter's checkout (default: this one's)"
    )
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--verbose", action="store_true", help="print each ten_1m run's turn intervals")
    parser.add_argument("--record", action="store_true", help="write bench/results/compare_reference.json")
    args = parser.parse_args(argv)
    if args.record and (args.only or args.server or args.lm_python):
        parser.error("--record writes every scenario of this checkout: drop --only, --server and --lm-python")
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
