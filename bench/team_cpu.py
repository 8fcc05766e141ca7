"""Where team mode's CPU goes (issue 39 item 6), for `bench/scale.py team`.

- `Idle`: what each replica spends per second with no run at all (heartbeats, sweeps, LISTEN
  loops, pollers), measured over `--idle-s` seconds before the concurrent round; multiplied by
  that round's wall time, it is the part of the team's CPU per turn that idles, not works.
- `Profiles`: py-spy (`--py-spy PATH`: a py-spy binary installed outside the project, e.g. in a
  scratch venv) attached to every replica (and the embedded process) during the concurrent
  round, `--nonblocking` at a low rate (`--py-spy-rate`, 40 a second unless set: 250 gives a few
  hundred samples per replica in a 10-turn round); raw stacks go to `--profile DIR` and the top frames are
  printed as shares of each process's samples. The sampler costs CPU of its own: a profiled
  run's CPU figures are not comparable with an unprofiled one's, only its shares are.
- `settle`: after each side's round, the wait until its processes are idle again, and the CPU
  they spent meanwhile above their idle rate (`--settle-s`), counted with the round's.
- `record`: `--record` appends the run's figures to bench/results/team_cpu.json.
"""

from __future__ import annotations

import collections
import datetime
import json
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import procfs
from bench.results_file import RESULTS, machine


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass
class Idle:
    """Per-second CPU of named processes over an idle wait, from each thread's scheduler
    statistics (`procfs.thread_cpu_ns`): an idle process spends a few ms a second, which /proc's
    10 ms ticks read as 1-6 ms/s."""

    per_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    async def measure(cls, pids: dict[str, int], seconds: float) -> Idle:
        before = {name: procfs.thread_cpu_ns(pid) for name, pid in pids.items()}
        t0 = time.perf_counter()
        await anyio.sleep(seconds)
        took = time.perf_counter() - t0
        return cls(
            {
                name: procfs.cpu_ns_between(before[name], procfs.thread_cpu_ns(pid)) / 1e9 / took
                for name, pid in pids.items()
            }
        )

    def total(self) -> float:
        return sum(self.per_s.values())

    def render(self) -> str:
        return ", ".join(f"{name} {rate * 1000:.1f} ms/s" for name, rate in self.per_s.items())


async def settle(
    pids: dict[str, int], idle_per_s: dict[str, float], *, cap_s: float, step_s: float = 0.5
) -> dict[str, float]:
    """Wait, from the moment a round's last run returned, until the processes are idle again, and
    say what each spent above its idle rate meanwhile (CPU seconds).

    A round's runs leave work behind them: sandboxes removed and the warm pool refilled, the last
    flushes and announcements. Read the moment the last call returned, a side's CPU left that
    work, and the Docker daemon's share of it, to whatever came next: with the sides alternating
    (E T | T E | E T ...) that is the same side's next round every other round, and the embedded
    process read higher in the rounds it ran twice in a row
    (`bench/results/team-settle-2026-12-02.md`). Idle means two steps in a row within half again
    the idle rate measured before the rounds, plus 3 ms/s (the threads' scheduler statistics,
    exact where /proc's ticks are 10 ms); `cap_s` bounds the wait."""
    idle_total = sum(idle_per_s.values())
    start = {name: procfs.cpu_seconds(pid) for name, pid in pids.items()}
    t0 = time.perf_counter()
    threads = {name: procfs.thread_cpu_ns(pid) for name, pid in pids.items()}
    quiet = 0
    while quiet < 2 and time.perf_counter() - t0 < cap_s:
        t = time.perf_counter()
        await anyio.sleep(step_s)
        now = {name: procfs.thread_cpu_ns(pid) for name, pid in pids.items()}
        rate = sum(procfs.cpu_ns_between(threads[n], now[n]) for n in pids) / 1e9 / (time.perf_counter() - t)
        threads = now
        quiet = quiet + 1 if rate <= 1.5 * idle_total + 0.003 else 0
    took = time.perf_counter() - t0
    spent = {
        name: procfs.cpu_seconds(pid) - start[name] - idle_per_s.get(name, 0.0) * took for name, pid in pids.items()
    }
    return spent


class Profiles:
    """py-spy recorders on several processes, started and stopped together."""

    def __init__(self, py_spy: str | None, folder: Path | None, rate: int = 40) -> None:
        self._py_spy, self._folder, self._rate = py_spy, folder, rate
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._prefix = ""

    @property
    def on(self) -> bool:
        return bool(self._py_spy and self._folder)

    def start(self, pids: dict[str, int], prefix: str = "") -> None:
        if not self.on:
            return
        assert self._folder is not None and self._py_spy is not None
        self._folder.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            out = self._folder / f"{prefix}{name}.txt"
            # --gil: only the thread holding the GIL is sampled, so the shares follow Python's CPU
            # (time in C without the GIL, libpq's or the kernel's, is not seen).
            argv = [self._py_spy, "record", "--nonblocking", "--gil", "--rate", str(self._rate), "--format", "raw"]
            argv += ["--pid", str(pid), "-o", str(out)]
            self._prefix = prefix
            self._procs[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        for proc in self._procs.values():
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for proc in self._procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self._procs:
            assert self._folder is not None
            for name in self._procs:
                print(shares(self._folder / f"{self._prefix}{name}.txt", self._prefix + name))
        self._procs = {}


# Buckets, first match wins, by a frame's function and file (py-spy raw lines: "fn (file:line)").
BUCKETS = [
    ("run log flush/publish", ("runlog.py", "store/pg/runs.py", "publish_until_done", "publishing.py")),
    ("front following runs", ("service/queue/front.py", "wakeups.py")),
    ("claims/heartbeat/sweeps", ("queue/worker.py:_claim", "_heartbeat", "sweeper.py", "store/pg/queue.py")),
    ("PostgreSQL driver", ("psycopg/", "psycopg_pool/")),
    ("MCP/HTTP serving", ("mcp/server", "starlette/", "uvicorn/", "sse_starlette/", "h11/", "httptools")),
    ("engine turns", ("rlm_mcp/engine/",)),
    ("LM client", ("rlm_mcp/lm/", "httpx", "aiohttp/")),
    ("sandbox", ("rlm_mcp/sandbox/", "docker/", "aiodocker/")),
    ("pydantic", ("pydantic",)),
]


def shares(path: Path, name: str, top: int = 14) -> str:
    """The process's samples by bucket (the innermost project-level frame that names one) and its
    top self frames."""
    if not path.exists():
        return f"  {name}: no profile"
    buckets: collections.Counter[str] = collections.Counter()
    selfs: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        selfs[frames[-1][:110]] += count
        found = "other"
        for frame in reversed(frames):  # innermost first
            hit = next((b for b, keys in BUCKETS if any(k in frame for k in keys)), None)
            if hit is not None and hit not in ("PostgreSQL driver", "pydantic"):
                found = hit
                break
            if hit is not None and found == "other":
                found = hit
        buckets[found] += count
    if total == 0:
        return f"  {name}: no samples"
    lines = [f"  {name}: {total} samples of the thread holding the GIL"]
    lines += [f"    {b:<26}{c / total:6.1%}" for b, c in buckets.most_common()]
    lines += ["    top self frames:"] + [f"      {c / total:6.1%} {f}" for f, c in selfs.most_common(top)]
    return "\n".join(lines)


def record(figures: dict[str, str]) -> Path:
    """Append one run's figures to bench/results/team_cpu.json (its rows: one per run)."""
    path = RESULTS / "team_cpu.json"
    columns = list(figures)
    data: dict[str, Any] = {"title": "Team mode's CPU per turn against embedded, one row per run", "rows": []}
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
    data.update(
        command=" ".join(shlex.quote(a) for a in ["bench/" + Path(sys.argv[0]).name, *sys.argv[1:]]),
        machine=machine(),
        date=datetime.date.today().isoformat(),
        columns=columns,
    )
    data["rows"].append([figures[c] for c in columns])
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")  # the file's own layout
    return path
