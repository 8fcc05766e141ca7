"""What the benchmarks read of a process from /proc: CPU time, peak memory, children, and the
groups of processes a turn passes through (this server, the scripted LM, Docker, containers)."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU nanoseconds of each of the process's live threads (`/proc/PID/task/*/schedstat`):
    exact where `cpu_seconds` counts 10 ms ticks, but a thread that exits takes its time away."""
    out: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out[task] = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return out


def cpu_ns_between(before: dict[str, int], after: dict[str, int]) -> int:
    """The threads' CPU between two `thread_cpu_ns` readings (a thread started since counts whole;
    one that exited in between, for nothing)."""
    return sum(ns - before.get(task, 0) for task, ns in after.items())


def cpu_seconds_of(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loop_cpu_seconds(pid: int) -> float:
    """CPU of the process's main thread (its event loop; the rest is worker threads: Docker and
    kernel I/O, blob reads, DNS)."""
    return cpu_seconds_of(Path(f"/proc/{pid}/task/{pid}/stat"))


def loop_wakeups(pid: int) -> int:
    """Context switches of the process's main thread so far (voluntary and not): about how often
    its event loop went to sleep in epoll and woke again."""
    counts = 0
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            counts += int(line.split()[1])
    return counts


def tree_cpu(pid: int) -> float:
    """CPU of `pid` and its children that are still alive (PostgreSQL's backends)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(entry) == pid or int(stat[1]) == pid:
                total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return total


def peak_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for row in fh:
                if row.startswith("VmHWM:"):
                    return int(row.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children_named(parent: int, needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and needle.encode() in cmdline:
            found.append(int(entry))
    return found


def task_cpu_ns(pid: int) -> int:
    """CPU time of a process, all its threads, in ns (schedstat: finer than stat's 10 ms ticks)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def process_groups(server: int, lm: int) -> dict[str, list[int]]:
    """The processes a turn passes through: this server, the scripted LM, Docker's daemons, and
    every container's shim and processes (the sandbox's kernel; other users' containers too)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        names[int(entry)] = stat[stat.index("(") + 1 : stat.rindex(")")]
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    shims = {pid for pid, name in names.items() if name.startswith("containerd-shim")}
    inside = set(shims)
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in inside} - inside
        inside |= more
        grew = bool(more)
    return {
        "rlm-mcp server": [server],
        "scripted LM": [lm],
        "dockerd + containerd": [pid for pid, name in names.items() if name in ("dockerd", "containerd")],
        "every container (others' too)": sorted(inside),
    }


def cpu_snapshot(groups: dict[str, list[int]]) -> dict[str, int]:
    return {name: sum(task_cpu_ns(pid) for pid in pids) for name, pids in groups.items()}


def host_cpu_ticks() -> tuple[int, int]:
    """The whole host's (busy, total) CPU time so far, in the kernel's ticks (`/proc/stat`'s first
    line: idle and iowait are not busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already counted in user time
    return total - idle, total


def host_busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the host's CPUs busy between two `host_cpu_ticks` readings (0 to 1)."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0
