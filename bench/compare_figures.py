"""The figures of bench/compare_reference.py: the scripted server's request log read per run,
the per-rep figures derived from the scenarios' times, CPU per further turn, and the printed and
recorded table."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench's own modules
from bench.results_file import ResultFile


class RequestLog:
    """The scripted server's request log (JSON lines, one per answered request), read by run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def since_last(self) -> list[dict[str, Any]]:
        """The requests answered since the last call (every request of the run just finished)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        return [json.loads(line) for line in data.splitlines() if line.strip()]


def turn_intervals(requests: list[dict[str, Any]]) -> list[float]:
    """Seconds between consecutive root requests' arrivals (each: a reply, a cell, the next request)."""
    roots = sorted(r["received"] for r in requests if r["role"] == "root")
    return [b - a for a, b in zip(roots, roots[1:], strict=False)]


def derive(raw: dict[str, list[float]], turns: list[float]) -> dict[str, list[float]]:
    """Per-rep figures (seconds): the measured turn, and those derived from the scenario times."""
    out: dict[str, list[float]] = {}
    if "one_1k" in raw:
        out["one-turn run (1 KiB)"] = raw["one_1k"]
    if turns:
        out["further turn, measured"] = turns
    if "ten_1m" in raw and "one_1m" in raw:
        derived = [(ten - one) / 9 for ten, one in zip(raw["ten_1m"], raw["one_1m"], strict=True)]
        out["further turn, derived"] = derived
        if "batch_1m" in raw:
            out["sub-call (16-way)"] = [
                (batch - one - 5 * turn) / 80
                for batch, one, turn in zip(raw["batch_1m"], raw["one_1m"], derived, strict=True)
            ]
    if "one_50m" in raw:
        out["one-turn run (50 MiB)"] = raw["one_50m"]
        if "five_50m" in raw:
            out["turn at 50 MiB"] = [(f - o) / 4 for f, o in zip(raw["five_50m"], raw["one_50m"], strict=True)]
    if "five_50m" in raw:
        out["5 turns on 50 MiB"] = raw["five_50m"]
    return out


def fmt(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms / 1000:.2f} s" if abs(ms) >= 1000 else f"{ms:.2f} ms"


def spread(values: list[float]) -> str:
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}, {fmt(max(values))}]"


def report(
    args: argparse.Namespace,
    ours: dict[str, list[float]],
    ref: dict[str, list[float]] | None,
    cpu: dict[str, list[float]],
) -> None:
    loads = " -> ".join("/".join(f"{x:.1f}" for x in load) for load in args.load)
    out = ResultFile(
        "compare_reference",
        "rlm-mcp beside the reference library",
        ["figure (median [min, max])", "rlm-mcp over stdio", "reference", "ratio"],
        note=(
            f"zero-latency scripted LM in a subprocess; {args.reps} reps"
            + ("" if ref is None else ", interleaved")
            + f"; big context {args.big_mib} MiB; load average (1, 5, 15 min) {loads}"
            + ("" if ref is not None else "; reference not run")
        ),
    )
    print(f"\nload average (1, 5, 15 min) {loads}")
    print(f"{'figure':<26}{'rlm-mcp median [min, max]':<36}{'reference median [min, max]':<36}ratio")
    for key, values in ours.items():
        theirs, ratio = "-", "-"
        if ref is not None and ref.get(key):
            theirs = spread(ref[key])
            # No ratio against a figure of ours at or below zero (a derived difference of two
            # noisy runs can be): it would read as a huge factor.
            if statistics.median(values) > 0:
                ratio = f"{statistics.median(ref[key]) / statistics.median(values):.0f}x"
                # "In every run": the worst of ours against the best of theirs, beside the medians';
                # and the worst of the reps' own pairs (each rep runs ours, then theirs).
                if min(ref[key]) > 0 and max(values) > 0:
                    pairs = [r / o for r, o in zip(ref[key], values, strict=True) if o > 0]
                    ratio += f" (worst {min(ref[key]) / max(values):.0f}x, worst rep {min(pairs):.0f}x)"
        print(f"{key:<26}{spread(values):<36}{theirs:<36}{ratio}")
        out.add(key, spread(values), theirs, ratio)
    if cpu:
        print("CPU per further turn by process ((ten_1m - one_1m) / 9 per rep, /proc schedstat; rlm-mcp's runs):")
    for group, values in cpu.items():
        print(f"  {group:<30}{spread(values)}")
        out.add(f"CPU per further turn: {group}", spread(values), "-", "")
    if args.record:
        print(f"written: {out.write()}")


def cpu_per_turn(cpu_ns: dict[str, list[dict[str, int]]]) -> dict[str, list[float]]:
    """CPU seconds per further turn by process, per rep, from each rep's one_1m and ten_1m runs."""
    if not (cpu_ns["one_1m"] and cpu_ns["ten_1m"]):
        return {}
    pairs = list(zip(cpu_ns["ten_1m"], cpu_ns["one_1m"], strict=True))
    # No total: the containers' group holds other users' containers too (on a shared machine,
    # whatever they did meanwhile), so it is shown alone.
    return {group: [(ten[group] - one[group]) / 9e9 for ten, one in pairs] for group in cpu_ns["one_1m"][0]}
