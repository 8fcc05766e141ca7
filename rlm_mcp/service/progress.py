"""Human-readable progress lines for MCP clients ("turn 3/20 · 12 sub-calls · 41 s")."""

from __future__ import annotations

import math
import time

from rlm_mcp.engine import RunPhase, RunProgress

# A caller waiting on a long step (a run, loading a big folder or a slow URL) gets a progress line
# at least this often: it must not look like a hang, and clients that reset their timeout on
# progress need it.
HEARTBEAT_S = 5.0

_PHASES = {
    RunPhase.QUEUED: "waiting for a free run slot",
    RunPhase.SANDBOX: "starting a sandbox",
    RunPhase.LM: "waiting for the model",
    RunPhase.CELL: "running code",
}


def describe(progress: RunProgress) -> str:
    """One short line a person can read; Claude Code shows about 200 characters of it."""
    phase = _PHASES.get(progress.phase)
    elapsed = time.monotonic() - progress.started
    if progress.iterations > progress.max_iterations:  # the extra "submit now" turn
        parts = [f"turn {progress.max_iterations}/{progress.max_iterations} (asked to submit)"]
    else:
        parts = [f"turn {progress.iterations}/{progress.max_iterations}"]
    parts.append(f"{progress.sub_calls} sub-call{'s' if progress.sub_calls != 1 else ''}")
    tokens = progress.usage.total.total
    if tokens:
        parts.append(f"{_human(tokens)} tokens")
    parts.append(f"{elapsed:.0f} s")
    line = " · ".join(parts)
    return f"{line} · {phase}" if phase else line


def _human(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    return str(n)


class ProgressValues:
    """Progress values for one request: the turn number, made strictly increasing.

    MCP requires each notification's `progress` to be larger than the last; heartbeats and
    several events within one turn would otherwise repeat the turn number (clients may drop
    or reject such notifications). Within a turn the value creeps towards the next integer.
    """

    def __init__(self) -> None:
        self._last: float | None = None

    def next(self, turn: int) -> float:
        value = float(turn)
        last = self._last
        if last is not None and value <= last:
            value = last + (max(float(turn) + 1.0, last + 1.0) - last) / 2
            if value <= last:  # halving ran out of precision: the smallest step up
                value = math.nextafter(last, math.inf)
        self._last = value
        return value
