"""Start-up time of `rlm-mcp`: this tree beside another revision's, the same commands alternating.

    .venv/bin/python bench/startup.py --before /path/to/other/checkout [--reps 5] [--record]

Every `uvx rlm-mcp` a client launches, every replica and every CLI command (and the test suite's
hundreds of server and CLI subprocesses) pays its imports on each start. Each command runs
`--reps` times from each tree (PYTHONPATH at the tree, the same interpreter and packages, the
order alternating), and the table gives the medians of the wall time and of the CPU time
(user + system, from the kernel's accounting of the reaped child), and after/before within the
run: on a shared machine only the ratios and the CPU times compare across runs.

- `--help`: the parser (every command builds it before it runs);
- `serve` (stdio): a whole embedded server with stdin closed: it starts (the sandbox-limits
  check, the MCP server, its lifespan), reads EOF and stops;
- `serve --role both` imports: what a team replica imports before it serves (its database and
  queue, the HTTP app, the assembly); the serving itself needs PostgreSQL;
- `runs list`: a one-off command on an empty data dir.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_file import ResultFile

HERE = Path(__file__).resolve().parent.parent

_BOTH_IMPORTS = (
    "import rlm_mcp.cli, rlm_mcp.cli.serve, rlm_mcp.store.pg, rlm_mcp.service.queue, "
    "rlm_mcp.server.http, rlm_mcp.server.app, rlm_mcp.assembly"
)
COMMANDS: dict[str, list[str]] = {
    "--help": ["-m", "rlm_mcp", "--help"],
    "serve (stdio)": ["-m", "rlm_mcp", "serve"],
    "serve --role both imports": ["-c", _BOTH_IMPORTS],
    "runs list": ["-m", "rlm_mcp", "runs", "list"],
}


def _once(tree: Path, argv: list[str], data_dir: str) -> tuple[float, float]:
    """Wall and CPU seconds of one start from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "RLM_MCP_DATA_DIR": data_dir}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, *argv], stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=data_dir)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{argv} from {tree} failed ({out.returncode}): {out.stderr.decode()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other revision's checkout")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--record", action="store_true", help="write bench/results/startup.json")
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": HERE}
    load_start = os.getloadavg()[0]
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        for rep in range(args.reps):
            order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
            for name, command in COMMANDS.items():
                for which in order:
                    wall, cpu = _once(trees[which], command, data_dir)
                    walls.setdefault((name, which), []).append(wall)
                    cpus.setdefault((name, which), []).append(cpu)
    load = f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    out = ResultFile(
        "startup",
        "Start-up time, medians (wall and CPU), this tree after the other",
        ["command", "wall before", "wall after", "after/before", "CPU before", "CPU after", "CPU after/before"],
        note=f"{args.reps} runs each, alternating; {load}",
    )
    print(f"{load}; {args.reps} runs each")
    for name in COMMANDS:
        wb, wa = (statistics.median(walls[name, w]) for w in ("before", "after"))
        cb, ca = (statistics.median(cpus[name, w]) for w in ("before", "after"))
        row = (name, f"{wb:.2f} s", f"{wa:.2f} s", f"{wa / wb:.2f}", f"{cb:.2f} s", f"{ca:.2f} s", f"{ca / cb:.2f}")
        print("  ".join(f"{c:>12}" for c in row))
        out.add(*row)
    if args.record:
        print(f"written: {out.write()}")


if __name__ == "__main__":
    main()
