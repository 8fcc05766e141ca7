"""Spans recorded in memory by the OpenTelemetry SDK, through rlm-mcp's own tracer provider (not
the global one), for the tests of what the engine, the LM client and the server trace. The
provider samples as `configure_from_env` installs it (`observability/sampling.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlm_mcp.observability import tracing
from rlm_mcp.observability.sampling import operator_sampler


@pytest.fixture
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    """Every span ended while the test runs (`get_finished_spans()`); tracing is off again after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=operator_sampler())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()
