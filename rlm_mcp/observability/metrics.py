"""The metrics of one process, in prometheus_client's default registry (with its process and
Python collectors), and the hooks the layers call when something happens.

Label sets are bounded by construction: statuses, roles, outcomes and error kinds are closed
sets; `endpoint` is "root" or "sub"; `model` is a model the operator configured (the root model,
the sub model, RLM_MCP_ALLOWED_SUB_MODELS). No run, context or owner id is ever a label.

Names follow Prometheus conventions: base units in the name (`_seconds`, `_bytes`), `_total` on
counters (prometheus_client adds it), one prefix (`rlm_mcp_`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, Protocol

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from rlm_mcp.observability.lm_calls import LMCallMetrics

__all__ = [
    "SandboxCounts",
    "SessionCounts",
    "cell_finished",
    "context_store",
    "lm_call",
    "lm_cost",
    "lm_error",
    "lm_limit",
    "lm_queueing_cut",
    "lm_retry",
    "lm_throttled",
    "run_finished",
    "run_started",
    "sandbox_start",
    "session_followup",
    "session_snapshot",
    "watch_sandboxes",
    "watch_sessions",
    "watch_team",
]

_P = "rlm_mcp"

# No `_created` series beside every counter and histogram: they double the series a scrape
# stores and no rule or panel here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Run durations span seconds to the 15-minute default limit (and beyond, with a larger one).
_RUN_S = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600)
# One LM call: tens of milliseconds (a short sub-call on a warm replica) to minutes (a long turn).
_LM_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
_CELL_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_START_S = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60)
_CLAIM_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
# A kept session's snapshot: a few KiB (a dict of counts) to the cap (RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES).
_SNAPSHOT_BYTES = tuple(float(2**k) for k in range(10, 31, 2))  # 1 KiB .. 1 GiB, by 4
_SNAPSHOT_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

RUNS_STARTED = Counter(f"{_P}_runs_started", "Runs that began executing in this process.")
RUNS_FINISHED = Counter(f"{_P}_runs_finished", "Runs that ended in this process, by final status.", ["status"])
RUNS_RUNNING = Gauge(f"{_P}_runs_running", "Runs executing in this process now.")
RUN_DURATION = Histogram(
    f"{_P}_run_duration_seconds", "Wall-clock time of a run, from start to its record.", ["status"], buckets=_RUN_S
)
RUN_TURNS = Histogram(
    f"{_P}_run_turns", "Root turns of a finished run.", buckets=(1, 2, 3, 5, 8, 13, 20, 30, 50, 100, 200)
)
RUN_SUB_CALLS = Histogram(
    f"{_P}_run_sub_calls", "Sub-calls of a finished run tree.", buckets=(0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2000)
)
TURNS = Counter(f"{_P}_turns", "Root turns of finished runs.")
SUB_CALLS = Counter(f"{_P}_sub_calls", "Sub-calls (llm_query and friends) of finished run trees.")

# Calls, latency, slot wait and tokens: one lock per LM call instead of seven (lm_calls.py).
LM_CALLS = LMCallMetrics(_P, _LM_S)
REGISTRY.register(LM_CALLS)
LM_RETRIES = Counter(f"{_P}_lm_retries", "LM request attempts retried, by what failed.", ["endpoint", "kind"])
LM_LIMIT = Gauge(
    f"{_P}_lm_concurrency_limit",
    "Calls this process lets be in flight to an endpoint and model now (adapts to 429/503 answers; "
    "RLM_MCP_MAX_CONCURRENT_LM_CALLS is its ceiling).",
    ["endpoint", "model"],
)
LM_THROTTLED = Counter(
    f"{_P}_lm_throttled",
    "Answers that asked for less load (429, 503), by endpoint and status.",
    ["endpoint", "status"],
)
LM_QUEUEING_CUTS = Counter(
    f"{_P}_lm_queueing_cuts",
    "Limit cuts for queueing read from latency (RLM_MCP_LM_QUEUEING_CUT), by endpoint.",
    ["endpoint"],
)
LM_ERRORS = Counter(f"{_P}_lm_errors", "LM requests that failed for good, by kind.", ["endpoint", "kind"])
LM_COST = Counter(
    f"{_P}_lm_cost_usd",
    "Cost of LM requests by the price table (RLM_MCP_MODEL_PRICES); models without a price are not counted.",
    ["model", "role"],
)

SANDBOX_STARTS = Histogram(
    f"{_P}_sandbox_start_duration_seconds", "Time to start one sandbox, kernel ready.", buckets=_START_S
)
SANDBOX_START_FAILURES = Counter(f"{_P}_sandbox_start_failures", "Sandbox starts that failed.")
CELLS = Histogram(f"{_P}_cell_duration_seconds", "Time one code cell ran in its sandbox.", buckets=_CELL_S)
CELL_TIMEOUTS = Counter(f"{_P}_cell_timeouts", "Cells interrupted at their time limit.")

CONTEXT_BYTES = Gauge(f"{_P}_context_store_bytes", "Bytes of stored contexts (each blob once), as last measured.")
CONTEXT_EVICTIONS = Counter(f"{_P}_context_evictions", "Stored contexts evicted (age, size cap, orphans).")

SESSION_FOLLOWUPS = Counter(
    f"{_P}_session_followups",
    "Runs that continued a kept session, by how they found its REPL: warm (its live sandbox) or "
    "restored (a fresh sandbox, its namespace loaded from the snapshot).",
    ["how"],
)
SESSION_SNAPSHOT_BYTES = Histogram(
    f"{_P}_session_snapshot_bytes", "Size of each kept session's snapshot taken.", buckets=_SNAPSHOT_BYTES
)
SESSION_SNAPSHOT_S = Histogram(
    f"{_P}_session_snapshot_seconds",
    "Time to take one kept session's snapshot (serialized in its sandbox and brought out).",
    buckets=_SNAPSHOT_S,
)

CLAIM_LATENCY = Histogram(
    f"{_P}_queue_claim_latency_seconds",
    "Team mode: time from a run's creation to a worker claiming it.",
    buckets=_CLAIM_S,
)


def run_started() -> None:
    RUNS_STARTED.inc()
    RUNS_RUNNING.inc()


def run_withdrawn(*, started: bool) -> None:
    """A run whose record the store refused: never accepted, so not finished either; it leaves
    the running gauge if it had begun executing (it stays in `runs_started`, a counter)."""
    if started:
        RUNS_RUNNING.dec()


def run_finished(status: str, duration_s: float, turns: int, sub_calls: int, *, started: bool) -> None:
    """A run's record was written with `status`; `started`: it had begun executing (counted by
    `run_started`), rather than ending while it waited for a slot."""
    RUNS_FINISHED.labels(status).inc()
    if started:
        RUNS_RUNNING.dec()
    RUN_DURATION.labels(status).observe(duration_s)
    RUN_TURNS.observe(turns)
    RUN_SUB_CALLS.observe(sub_calls)
    TURNS.inc(turns)
    SUB_CALLS.inc(sub_calls)


def lm_call(
    endpoint: str,
    model: str,
    role: str,
    outcome: str,
    latency_s: float,
    queued_s: float,
    prompt_tokens: int,
    completion_tokens: int,
    cached_prompt_tokens: int,
) -> None:
    """One LM request ended (`outcome`: ok, or the error kind's name)."""
    LM_CALLS.observe(
        endpoint, model, role, outcome, latency_s, queued_s, prompt_tokens, completion_tokens, cached_prompt_tokens
    )


def lm_cost(model: str, role: str, cost_usd: float) -> None:
    LM_COST.labels(model, role).inc(cost_usd)


def lm_retry(endpoint: str, kind: str) -> None:
    LM_RETRIES.labels(endpoint, kind).inc()


def lm_limit(endpoint: str, model: str, limit: int) -> None:
    LM_LIMIT.labels(endpoint, model).set(limit)


def lm_throttled(endpoint: str, status: int) -> None:
    LM_THROTTLED.labels(endpoint, str(status)).inc()


def lm_queueing_cut(endpoint: str) -> None:
    LM_QUEUEING_CUTS.labels(endpoint).inc()


def lm_error(endpoint: str, kind: str) -> None:
    LM_ERRORS.labels(endpoint, kind).inc()


def sandbox_start(duration_s: float | None) -> None:
    """A sandbox start ended: its duration, or None when it failed."""
    if duration_s is None:
        SANDBOX_START_FAILURES.inc()
    else:
        SANDBOX_STARTS.observe(duration_s)


def cell_finished(duration_s: float, timed_out: bool) -> None:
    CELLS.observe(duration_s)
    if timed_out:
        CELL_TIMEOUTS.inc()


def context_store(total_bytes: int | None, evicted: int) -> None:
    """An eviction pass: the bytes stored after it (None: not measured) and contexts it removed."""
    if total_bytes is not None:
        CONTEXT_BYTES.set(total_bytes)
    if evicted:
        CONTEXT_EVICTIONS.inc(evicted)


def claim_latency(seconds: float) -> None:
    CLAIM_LATENCY.observe(max(0.0, seconds))


def session_followup(how: Literal["warm", "restored"]) -> None:
    SESSION_FOLLOWUPS.labels(how).inc()


def session_snapshot(size_bytes: int, seconds: float) -> None:
    """A kept session's snapshot was taken (whether or not it could then be kept)."""
    SESSION_SNAPSHOT_BYTES.observe(size_bytes)
    SESSION_SNAPSHOT_S.observe(max(0.0, seconds))


# --- gauges read when scraped ---------------------------------------------------------------


class SandboxCounts(Protocol):
    def sandbox_counts(self) -> tuple[int, int, int]:
        """(running: held by a run, warm: ready in the pool, starting)."""
        ...


class SessionCounts(Protocol):
    def session_counts(self) -> tuple[int, int]:
        """(live: its REPL in a sandbox of this process, released: kept here as a snapshot only)."""
        ...


_sandbox_sources: weakref.WeakSet[SandboxCounts] = weakref.WeakSet()
_session_sources: weakref.WeakKeyDictionary[SessionCounts, str] = weakref.WeakKeyDictionary()
# Team mode: a function giving (queue depth, oldest queued age in seconds, workers alive), read
# from the last snapshot the process took (scrapes never wait on the database).
_team_source: list[Callable[[], tuple[int, float, int] | None]] = []


def watch_sandboxes(source: SandboxCounts) -> None:
    """Report `source`'s sandboxes (a sandbox manager) while it lives."""
    _sandbox_sources.add(source)


def watch_sessions(source: SessionCounts, mode: Literal["embedded", "team"]) -> None:
    """Report `source`'s kept sessions (a session manager) while it lives."""
    _session_sources[source] = mode


def watch_team(snapshot: Callable[[], tuple[int, float, int] | None]) -> Callable[[], None]:
    """Report the queue gauges from `snapshot` until the returned function is called."""
    _team_source.append(snapshot)

    def stop() -> None:
        if snapshot in _team_source:
            _team_source.remove(snapshot)

    return stop


class _Sampled(Collector):
    def collect(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(f"{_P}_sandboxes", "Sandboxes of this process by state.", labels=["state"])
        totals = [0, 0, 0]
        for source in list(_sandbox_sources):
            for i, n in enumerate(source.sandbox_counts()):
                totals[i] += n
        for state, n in zip(("running", "warm", "starting"), totals, strict=True):
            family.add_metric([state], n)
        yield family
        yield self._sessions()
        snapshot = _team_source[-1]() if _team_source else None
        if snapshot is None:
            return
        depth, oldest, alive = snapshot
        yield GaugeMetricFamily(f"{_P}_queue_depth", "Team mode: runs queued, not yet claimed.", value=depth)
        yield GaugeMetricFamily(
            f"{_P}_queue_oldest_age_seconds", "Team mode: age of the oldest queued run (0 when none).", value=oldest
        )
        yield GaugeMetricFamily(f"{_P}_workers_alive", "Team mode: workers with a live heartbeat.", value=alive)

    @staticmethod
    def _sessions() -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            f"{_P}_sessions_open",
            "Kept sessions this process holds, by mode (embedded, team: a worker's) and state (live: "
            "its REPL in a sandbox here; released: kept as a snapshot only, restored by its next run).",
            labels=["mode", "state"],
        )
        counts: dict[tuple[str, str], int] = {}
        for source, mode in list(_session_sources.items()):
            for state, n in zip(("live", "released"), source.session_counts(), strict=True):
                counts[mode, state] = counts.get((mode, state), 0) + n
        for (mode, state), n in sorted(counts.items()):
            family.add_metric([mode, state], n)
        return family


REGISTRY.register(_Sampled())
