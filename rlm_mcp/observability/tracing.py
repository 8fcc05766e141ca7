"""OpenTelemetry spans of runs, turns, LM calls, cells, sub-call batches and child RLMs.

Only the OpenTelemetry API is imported here (it comes with `mcp`): with no SDK configured every
span is the API's non-recording one, a few microseconds. `configure_from_env` installs the SDK
and an OTLP/HTTP exporter when the standard variables ask for traces (`OTEL_TRACES_EXPORTER=otlp`
or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`), and never when `OTEL_SDK_DISABLED=true`.

Where spans hang: the `mcp` SDK opens a server span per inbound message (its default
`OpenTelemetryMiddleware`, continuing a caller's `params._meta.traceparent`). A run started by a
tool call captures that context (`carrier`) into its record's `trace_context`, so the run's span
is its child wherever the run executes: in this process, or on a team worker that claimed it.
LM requests carry the context on as a `traceparent` header (vLLM continues it when traced).

Prompt and completion text are recorded only when
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` (the GenAI conventions' setting).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

from rlm_mcp.usage import Accounted

log = logging.getLogger("rlm_mcp.observability")

__all__ = [
    "capture_content",
    "carrier",
    "configure_from_env",
    "inject_headers",
    "lm_span",
    "lm_span_done",
    "lm_span_failed",
    "run_span",
    "span",
    "use_tracer_provider",
    "wants_traces",
]

# None until a real tracer provider is installed (by `configure_from_env`, or by an application
# that embeds rlm-mcp and set its own): until then every helper below returns at once, without
# even the API's no-op span and context switch (~4 us a span, several per sub-call).
_tracer: trace.Tracer | None = None


def _active() -> trace.Tracer | None:
    global _tracer
    if _tracer is None and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _tracer = trace.get_tracer("rlm_mcp")
    return _tracer


def wants_traces(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the standard OTEL_* variables ask for traces exported over OTLP."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return "otlp" in {e.strip() for e in exporter.split(",")}
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


_configured: list[Any] = []  # the SDK's TracerProvider, once installed
_shutdown_lock = threading.Lock()


def configure_from_env(service_name: str = "rlm-mcp") -> bool:
    """Install the SDK with a batching OTLP/HTTP exporter when the environment asks for traces.
    True when traces are exported. Without the SDK installed it says how to get it, once."""
    if _configured:
        return True
    if not wants_traces():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces, but the OpenTelemetry SDK is not installed: no spans are exported. "
            "Install it with `pip install 'rlm-mcp[otel]'` (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)."
        )
        return False
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name}).merge(
        OTELResourceDetector().detect()
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _configured.append(provider)
    _active()
    log.info("tracing: exporting spans over OTLP/HTTP")
    return True


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Record rlm-mcp's spans with `provider` (an application embedding rlm-mcp, a test), or
    stop recording them (None), without touching OpenTelemetry's global provider."""
    global _tracer
    _tracer = provider.get_tracer("rlm_mcp") if provider is not None else None


def shutdown() -> None:
    """Flush and stop the exporter (at the end of the process)."""
    # The signal path's exit thread and the main thread's `finally` may both get here: the
    # second waits for the first's flush, so neither exits the process halfway through it.
    with _shutdown_lock:
        providers = list(_configured)
        _configured.clear()
        for provider in providers:
            provider.shutdown()


def capture_content() -> bool:
    value = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return value.strip().lower() == "true"


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers (`traceparent`, `tracestate`), for a run record;
    None outside a sampled span."""
    if _active() is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    propagate.inject(out)
    return out or None


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """`headers` with the current span's `traceparent` added (unchanged outside a span)."""
    if _active() is not None and trace.get_current_span().get_span_context().is_valid:
        propagate.inject(headers)
    return headers


@contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, kind: SpanKind = SpanKind.INTERNAL
) -> Iterator[Span]:
    """A child of the current span (the invalid span when tracing is off)."""
    tracer = _active()
    if tracer is None:
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes) as current:
        yield current


@contextmanager
def run_span(
    trace_context: Mapping[str, str] | None, attributes: Mapping[str, Any], *, name: str = "rlm.run"
) -> Iterator[Span]:
    """The span of one run: a child of the context its record carries (the MCP call that started
    it, perhaps in another process), else of the current span."""
    tracer = _active()
    if tracer is None:
        yield trace.INVALID_SPAN
        return
    parent = propagate.extract(dict(trace_context)) if trace_context else None
    token = otel_context.attach(parent) if parent is not None else None
    try:
        with tracer.start_as_current_span(name, attributes=attributes) as current:
            yield current
    finally:
        if token is not None:
            otel_context.detach(token)


@contextmanager
def lm_span(*, model: str, role: str, endpoint: str, max_tokens: int) -> Iterator[Span]:
    """One LM request, named and attributed by the GenAI semantic conventions."""
    tracer = _active()
    if tracer is None:
        yield trace.INVALID_SPAN
        return
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "rlm.lm.role": role,
        "rlm.lm.endpoint": endpoint,
    }
    with tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes) as current:
        yield current


def lm_span_done(current: Span, record: Accounted, finish_reason: str | None) -> None:
    if not current.is_recording():
        return
    current.set_attribute("gen_ai.usage.input_tokens", record.prompt_tokens)
    current.set_attribute("gen_ai.usage.output_tokens", record.completion_tokens)
    if record.cached_prompt_tokens:
        current.set_attribute("gen_ai.usage.cache_read.input_tokens", record.cached_prompt_tokens)
    if finish_reason is not None:
        current.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    if record.cost_usd is not None:
        current.set_attribute("rlm.cost_usd", record.cost_usd)


def lm_span_failed(current: Span, kind: str) -> None:
    if current.is_recording():
        current.set_attribute("error.type", kind)
        current.set_status(StatusCode.ERROR)


def run_span_done(current: Span, status: str, turns: int, sub_calls: int, usage: Accounted) -> None:
    if not current.is_recording():
        return
    current.set_attribute("rlm.run.status", status)
    current.set_attribute("rlm.run.turns", turns)
    current.set_attribute("rlm.run.sub_calls", sub_calls)
    current.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
    current.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
    if usage.cost_usd is not None:
        current.set_attribute("rlm.cost_usd", usage.cost_usd)
    if status == "error":
        current.set_status(StatusCode.ERROR, status)


def cell_done(current: Span, *, error: str | None, timed_out: bool, restarted: bool) -> None:
    if not current.is_recording():
        return
    current.set_attribute("rlm.cell.timed_out", timed_out)
    current.set_attribute("rlm.cell.restarted", restarted)
    if error:
        current.set_attribute("error.type", error.split(":", 1)[0][:80])


def lm_content(current: Span, messages: list[dict[str, str]], reply: str | None) -> None:
    """The prompt and completion text, only when the GenAI capture setting asks for it."""
    if not current.is_recording() or not capture_content():
        return
    import json

    current.set_attribute("gen_ai.input.messages", json.dumps(messages, ensure_ascii=False))
    if reply is not None:
        current.set_attribute(
            "gen_ai.output.messages", json.dumps([{"role": "assistant", "content": reply}], ensure_ascii=False)
        )
