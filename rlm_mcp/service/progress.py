"""Human-readable progress lines for MCP clients ("turn 3/20 · 12 sub-calls · 41 s")."""

from __future__ import annotations

import time

from rlm_mcp.engine import RunProgress


_PHASES = {"sandbox": "starting a sandbox", "lm": "waiting for the model", "cell": "running code"}


def describe(progress: RunProgress, *, phase: str | None = None) -> str:
    """One short line a person can read; Claude Code shows about 200 characters of it."""
    phase = phase or _PHASES.get(progress.phase)
    elapsed = time.monotonic() - progress.started
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
