"""The metrics of LM calls (calls, latency, slot wait, tokens), counted in plain numbers and turned
into Prometheus families when scraped.

Every LM call updates six series (a sub-call batch of 200 makes 1,200 updates): as prometheus_client
`Counter` and `Histogram` children that is seven locks, five observability checks and a loop over
the buckets per call. Here one lock per call guards plain additions and a bisection, and `collect`
builds what those metrics would expose: the same names, help, label sets, series order (the
order each label set was first seen), bucket bounds and float values, so a scrape cannot tell
them apart (tests/unit/test_lm_call_metrics.py compares the two).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_NEGATIVE = "Counters can only be incremented by non-negative amounts."  # prometheus_client's words


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0.0] * buckets  # per bucket, not cumulative (as prometheus_client keeps them)
        self.sum = 0.0


class _Series:
    """What one (endpoint, model, role, outcome) call updates, looked up once."""

    __slots__ = ("cached", "calls", "completion", "duration", "prompt", "queued")

    def __init__(
        self,
        calls: _Count,
        duration: _Histogram,
        queued: _Histogram,
        prompt: _Count,
        completion: _Count,
        cached: _Count,
    ) -> None:
        self.calls, self.duration, self.queued = calls, duration, queued
        self.prompt, self.completion, self.cached = prompt, completion, cached


def _observe(histogram: _Histogram, bounds: tuple[float, ...], amount: float) -> None:
    histogram.sum += amount
    if amount == amount:  # NaN counts in no bucket (prometheus_client's loop finds none either)
        histogram.counts[bisect_left(bounds, amount)] += 1.0


def _refuse_negative(series: _Series, prompt: int, completion: int, cached: int) -> None:
    """What prometheus_client's counters do, in order: the counts before the negative one are
    added, then it raises."""
    for count, amount in ((series.prompt, prompt), (series.completion, completion), (series.cached, cached)):
        if amount < 0:
            raise ValueError(_NEGATIVE)
        count.value += amount


class LMCallMetrics(Collector):
    """`rlm_mcp_lm_calls_total`, `rlm_mcp_lm_call_duration_seconds`, `rlm_mcp_lm_call_queued_seconds`
    and `rlm_mcp_lm_tokens_total`, as four prometheus_client metrics of these names, help texts,
    labels and buckets would expose them."""

    def __init__(self, prefix: str, duration_buckets: tuple[float, ...]) -> None:
        self._p = prefix
        self._bounds = (*(float(b) for b in duration_buckets), float("inf"))
        self._le = [floatToGoString(b) for b in self._bounds]  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str, str, str], _Series] = {}
        # Per metric, its label sets in the order first seen (the order a scrape lists them).
        self._calls: dict[tuple[str, ...], _Count] = {}
        self._duration: dict[tuple[str, ...], _Histogram] = {}
        self._queued: dict[tuple[str, ...], _Histogram] = {}
        self._tokens: dict[tuple[str, ...], _Count] = {}

    def observe(
        self,
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
        series = self._series.get((endpoint, model, role, outcome))
        if series is None:
            series = self._add(endpoint, model, role, outcome)
        bounds = self._bounds
        with self._lock:
            series.calls.value += 1.0
            _observe(series.duration, bounds, latency_s)
            _observe(series.queued, bounds, queued_s)
            # Checked together, then added: no pairs built and looped over per LM call.
            if prompt_tokens < 0 or completion_tokens < 0 or cached_prompt_tokens < 0:
                _refuse_negative(series, prompt_tokens, completion_tokens, cached_prompt_tokens)
            series.prompt.value += prompt_tokens
            series.completion.value += completion_tokens
            series.cached.value += cached_prompt_tokens

    def _add(self, endpoint: str, model: str, role: str, outcome: str) -> _Series:
        size = len(self._bounds)
        with self._lock:
            calls = self._calls.setdefault((endpoint, model, role, outcome), _Count())
            duration = self._duration.setdefault((endpoint, model, role), _Histogram(size))
            queued = self._queued.setdefault((endpoint,), _Histogram(size))
            prompt = self._tokens.setdefault((model, role, "prompt"), _Count())
            completion = self._tokens.setdefault((model, role, "completion"), _Count())
            cached = self._tokens.setdefault((model, role, "cached_prompt"), _Count())
            series = _Series(calls, duration, queued, prompt, completion, cached)
            self._series[(endpoint, model, role, outcome)] = series
        return series

    def describe(self) -> list[Any]:
        return list(self._families(with_samples=False))

    def collect(self) -> Iterator[Any]:
        with self._lock:
            families = list(self._families(with_samples=True))
        return iter(families)

    def _families(self, *, with_samples: bool) -> Iterator[Any]:
        p = self._p
        calls = CounterMetricFamily(
            f"{p}_lm_calls",
            "LM requests by endpoint, model, role and outcome.",
            labels=["endpoint", "model", "role", "outcome"],
        )
        duration = HistogramMetricFamily(
            f"{p}_lm_call_duration_seconds",
            "Latency of one LM request, retries included, slot wait excluded.",
            labels=["endpoint", "model", "role"],
        )
        queued = HistogramMetricFamily(
            f"{p}_lm_call_queued_seconds",
            "Time an LM request waited for a concurrency slot (RLM_MCP_MAX_CONCURRENT_LM_CALLS).",
            labels=["endpoint"],
        )
        tokens = CounterMetricFamily(
            f"{p}_lm_tokens",
            "Tokens of LM requests: prompt, completion, and the prompt tokens served from the prefix cache.",
            labels=["model", "role", "kind"],
        )
        if with_samples:
            for key, count in self._calls.items():
                calls.add_metric(list(key), count.value)
            for family, histograms in ((duration, self._duration), (queued, self._queued)):
                for key, histogram in histograms.items():
                    family.add_metric(list(key), self._cumulative(histogram), histogram.sum)
            for key, count in self._tokens.items():
                tokens.add_metric(list(key), count.value)
        yield from (calls, duration, queued, tokens)

    def _cumulative(self, histogram: _Histogram) -> list[tuple[str, float]]:
        total, out = 0.0, []
        for le, count in zip(self._le, histogram.counts, strict=True):
            total += count
            out.append((le, total))
        return out
