"""OpenTelemetry spans of runs, turns, LM calls, cells, sub-call batches and child RLMs.

Only the OpenTelemetry API is imported here (it comes with `mcp`): with no SDK configured every
span is the API's non-recording one, a few microseconds. `configure_from_env` installs the SDK
and an OTLP/HTTP exporter when the standard variables ask for traces (`OTEL_TRACES_EXPORTER=otlp`
or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`), and never when `OTEL_SDK_DISABLED=true`.

Where spans hang: the server opens a server span per inbound message (`server_span`, from
`server/trace_header.py` in place of the SDK's `OpenTelemetryMiddleware`, named only with
method and tool names the server defines), continuing a caller's `params._meta.traceparent`. A
run started by a tool call captures that context (`carrier`) into its record's `trace_context`,
so the run's span is its child wherever the run executes: in this process, or on a team worker
that claimed it. LM requests carry the context on as a `traceparent` header (vLLM continues it
when traced).

A caller's trace context is taken as a parent only: its `traceparent`, never its `tracestate` or
baggage (neither reaches the LM endpoint nor a stored record), and not its sampled flag either:
whether rlm-mcp records a trace is its own sampler's decision (`sampling.py`, from
OTEL_TRACES_SAMPLER), so a client sending an unsampled `traceparent` cannot switch tracing off.

Prompt and completion text are recorded only when
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` (the GenAI conventions' setting).
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

from rlm_mcp.usage import Accounted

log = logging.getLogger("rlm_mcp.observability")

__all__ = [
    "capture_content",
    "carrier",
    "caller_context",
    "configure_from_env",
    "enabled",
    "inject_headers",
    "lm_span",
    "lm_span_done",
    "lm_span_failed",
    "run_span",
    "server_span",
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
    if (
        _tracer is None
        and _provider_may_be_set()
        and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    ):
        _tracer = trace.get_tracer("rlm_mcp")
    return _tracer


# Whether the environment names a tracer provider for the API to load (`get_tracer_provider`
# loads it on first use): read once, as the API's own entry point is meant to be.
_ENV_PROVIDER: list[bool] = []


def _provider_may_be_set() -> bool:
    """False only when `get_tracer_provider()` would surely answer its proxy: no provider was
    set and the environment names none. `get_tracer_provider` looks the variable up in
    os.environ on every call (a KeyError raised and caught, ~1.5 us), and this is asked a few
    times per sub-call while no tracer is installed, so the API's global is read first."""
    if getattr(trace, "_TRACER_PROVIDER", True) is not None:
        return True  # set (or an API version without that global: ask it)
    if not _ENV_PROVIDER:
        _ENV_PROVIDER.append(OTEL_PYTHON_TRACER_PROVIDER in os.environ)
    return _ENV_PROVIDER[0]


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

        from rlm_mcp.observability.sampling import operator_sampler
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces, but the OpenTelemetry SDK is not installed: no spans are exported. "
            "Install it with `pip install 'rlm-mcp[otel]'` (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)."
        )
        return False
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name}).merge(
        OTELResourceDetector().detect()
    )
    provider = TracerProvider(resource=resource, sampler=operator_sampler())
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


# How long the process's end waits for the spans still batched to go out. A collector that
# accepts the connection and never answers held the SDK's shutdown for its export timeout and
# retries (18 s after SIGTERM, where a service manager may be about to SIGKILL): a healthy one
# takes milliseconds, so a few seconds lose nothing but a stuck collector's spans.
SHUTDOWN_S = 3.0


def shutdown(within_s: float = SHUTDOWN_S) -> None:
    """Flush and stop the exporter (at the end of the process), waiting at most `within_s`."""
    # The signal path's exit thread and the main thread's `finally` may both get here: the
    # second waits for the first's flush, so neither exits the process halfway through it.
    with _shutdown_lock:
        providers = list(_configured)
        _configured.clear()
        if not providers:
            return
        # The SDK's shutdown cannot be told a deadline: it runs on a daemon thread, which the
        # process does not wait for once this gives up on it.
        flusher = threading.Thread(
            target=lambda: [p.shutdown() for p in providers], name="rlm-mcp-trace-shutdown", daemon=True
        )
        flusher.start()
        flusher.join(within_s)
        if flusher.is_alive():
            log.warning("tracing: the trace collector did not take the last spans within %.0f s; exiting", within_s)


def capture_content() -> bool:
    value = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return value.strip().lower() == "true"


def enabled() -> bool:
    """Whether spans are recorded (a tracer provider is installed)."""
    return _active() is not None


def _traceparent() -> dict[str, str]:
    """The current span's `traceparent` alone: never a `tracestate` (or baggage) a caller sent,
    which is theirs to give their own vendors, not our LM endpoint or our stored records."""
    out: dict[str, str] = {}
    propagate.inject(out)
    return {"traceparent": out["traceparent"]} if "traceparent" in out else {}


def carrier() -> dict[str, str] | None:
    """The current trace context as a W3C `traceparent`, for a run record; None outside a
    sampled span."""
    if _active() is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    return _traceparent() or None


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """`headers` with the current span's `traceparent` added (unchanged outside a span)."""
    if _active() is not None and trace.get_current_span().get_span_context().is_valid:
        headers.update(_traceparent())
    return headers


def caller_context(meta: Mapping[str, Any] | None) -> otel_context.Context | None:
    """The trace context a caller's `_meta` names by its `traceparent` (only: its `tracestate`
    and baggage are not taken in), or None when it names none that is valid."""
    parent = meta.get("traceparent") if meta else None
    if not isinstance(parent, str):
        return None
    try:
        found = propagate.extract({"traceparent": parent})
    except (ValueError, TypeError):
        return None
    return found if trace.get_current_span(found).get_span_context().is_valid else None


@contextmanager
def server_span(name: str, attributes: Mapping[str, AttributeValue], meta: Mapping[str, Any] | None) -> Iterator[Span]:
    """The server span of one inbound MCP message, a child of the caller's trace when its
    `_meta` carries one. Exceptions are not recorded: their text may be the caller's."""
    tracer = _active()
    if tracer is None:
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(
        name,
        context=caller_context(meta),
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        yield current


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
    parent = caller_context(trace_context)
    token = otel_context.attach(parent) if parent is not None else None
    try:
        with tracer.start_as_current_span(name, attributes=attributes) as current:
            yield current
    finally:
        if token is not None:
            otel_context.detach(token)


class _NoSpan(AbstractContextManager[Span]):
    """What `lm_span` gives while no tracer is installed: the API's invalid span, without the
    cost of a generator context manager on every LM call."""

    def __enter__(self) -> Span:
        return trace.INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


def lm_span(*, model: str, role: str, endpoint: str, max_tokens: int) -> AbstractContextManager[Span]:
    """One LM request, named and attributed by the GenAI semantic conventions."""
    tracer = _active()
    if tracer is None:
        return _NO_SPAN
    return _lm_span(tracer, model=model, role=role, endpoint=endpoint, max_tokens=max_tokens)


@contextmanager
def _lm_span(tracer: trace.Tracer, *, model: str, role: str, endpoint: str, max_tokens: int) -> Iterator[Span]:
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
        current.set_attribute("error.type", cell_error_type(error))


# A cell's error names its exception class first ("ValueError: ..."). The model's code may define
# its own class and name it anything: with message capture off no text the code chose may reach
# the trace store, so only builtin exception names (and the host's own) pass.
_BUILTIN_ERRORS = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
) | {"SandboxRestarted"}
OTHER_ERROR = "_OTHER"  # the OpenTelemetry conventions' value for an error.type not on the list


def cell_error_type(error: str) -> str:
    """The `error.type` of a cell's error: its builtin exception name, else `OTHER_ERROR`."""
    name = error.split(":", 1)[0].strip()
    return name if name in _BUILTIN_ERRORS else OTHER_ERROR


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
