"""The LM call metrics, counted in plain numbers (observability/lm_calls.py), expose what the
prometheus_client metrics of the same names, help texts, labels and buckets exposed for the same
calls: byte for byte on a scrape, series order included."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from rlm_mcp.observability import metrics  # its import turns off the `_created` series
from rlm_mcp.observability.lm_calls import LMCallMetrics

_LM_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)

# (endpoint, model, role, outcome, latency_s, queued_s, prompt, completion, cached)
_CALLS = [
    ("root", "m", "root", "ok", 0.3, 0.0, 100, 20, 0),
    ("sub", "s", "sub", "ok", 0.01, 0.002, 8, 1, 0),
    ("sub", "s", "sub", "ok", 0.025, 0.5, 8, 1, 4),  # on a bucket's bound
    ("sub", "s", "sub", "timeout", 61.0, 0.0, 0, 0, 0),  # another outcome, no tokens
    ("root", "m", "root", "ok", 400.0, 1e-9, 3, 0, 3),  # past the last bound
    ("sub", "m", "sub", "ok", 0.0, 0.0, 5, 5, 0),  # the root model as a sub-call's
    ("root", "m", "root", "server_error", math.nan, 0.0, 0, 0, 0),  # a NaN lands in no bucket
    ("sub", "s", "sub", "ok", -0.5, 0.0, 1, 1, 1),
]


def _reference(registry: CollectorRegistry) -> tuple[Counter, Histogram, Histogram, Counter]:
    calls = Counter(
        "rlm_mcp_lm_calls",
        "LM requests by endpoint, model, role and outcome.",
        ["endpoint", "model", "role", "outcome"],
        registry=registry,
    )
    duration = Histogram(
        "rlm_mcp_lm_call_duration_seconds",
        "Latency of one LM request, retries included, slot wait excluded.",
        ["endpoint", "model", "role"],
        buckets=_LM_S,
        registry=registry,
    )
    queued = Histogram(
        "rlm_mcp_lm_call_queued_seconds",
        "Time an LM request waited for a concurrency slot (RLM_MCP_MAX_CONCURRENT_LM_CALLS).",
        ["endpoint"],
        buckets=_LM_S,
        registry=registry,
    )
    tokens = Counter(
        "rlm_mcp_lm_tokens",
        "Tokens of LM requests: prompt, completion, and the prompt tokens served from the prefix cache.",
        ["model", "role", "kind"],
        registry=registry,
    )
    return calls, duration, queued, tokens


def _observe_reference(metrics_: tuple[Counter, Histogram, Histogram, Counter], call: tuple[Any, ...]) -> None:
    calls, duration, queued, tokens = metrics_
    endpoint, model, role, outcome, latency, waited, prompt, completion, cached = call
    calls.labels(endpoint, model, role, outcome).inc()
    duration.labels(endpoint, model, role).observe(latency)
    queued.labels(endpoint).observe(waited)
    children = [tokens.labels(model, role, kind) for kind in ("prompt", "completion", "cached_prompt")]
    for child, amount in zip(children, (prompt, completion, cached), strict=True):
        if amount:
            child.inc(amount)


@pytest.mark.parametrize("upto", [0, 1, 3, len(_CALLS)])
def test_a_scrape_reads_what_the_prometheus_client_metrics_wrote(upto: int) -> None:
    before, after = CollectorRegistry(), CollectorRegistry()
    reference = _reference(before)
    mine = LMCallMetrics("rlm_mcp", _LM_S)
    after.register(mine)
    for call in _CALLS[:upto]:
        _observe_reference(reference, call)
        mine.observe(*call)
    assert generate_latest(after).decode() == generate_latest(before).decode()


def test_a_negative_token_count_is_refused_as_a_counter_refuses_it() -> None:
    mine = LMCallMetrics("rlm_mcp", _LM_S)
    with pytest.raises(ValueError, match="non-negative"):
        mine.observe("sub", "s", "sub", "ok", 0.1, 0.0, -1, 0, 0)


def test_the_process_registry_serves_them_once() -> None:
    from prometheus_client import REGISTRY

    metrics.lm_call("root", "probe-model", "root", "ok", 0.2, 0.0, 3, 2, 0)
    text = generate_latest(REGISTRY).decode()
    assert text.count("# TYPE rlm_mcp_lm_calls_total counter") == 1
    assert 'rlm_mcp_lm_tokens_total{kind="completion",model="probe-model",role="root"}' in text
    assert (
        REGISTRY.get_sample_value(
            "rlm_mcp_lm_call_duration_seconds_bucket",
            {"endpoint": "root", "model": "probe-model", "role": "root", "le": "0.25"},
        )
        is not None
    )
