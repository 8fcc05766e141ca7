"""What metrics and tracing cost a run: per further turn and per sub-call, with the hooks off
(replaced by no-ops), with metrics on (as shipped: Prometheus counters and histograms, the
OpenTelemetry API's no-op spans), and with metrics and tracing on (the SDK recording every span
into a batching processor whose exporter drops them, so no receiver's speed is measured).

    .venv/bin/python bench/observability.py [--repeat 7] [--loops 20000]

Both parts run in one process, the modes interleaved so that the machine's load falls on each:
  hooks       the hook calls of one turn and of one sub-call, timed in a loop (CPU, microseconds)
  whole runs  RlmService with a real Docker sandbox and the zero-latency scripted LM in a
              subprocess (bench/run.py's service and runs): per further turn = (10-turn run - 1-turn run) / 9,
              per sub-call = (200-prompt batch run - 1-turn run) / 200
Never fails on a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from rlm_mcp.observability import metrics, tracing
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.chat import CallRecord
from rlm_mcp.service.caller import Caller

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.run's whole-run loop
from bench.run import bench_service, timed_run

MODES = ("off", "metrics", "metrics+tracing")
GAP_S = 1.0  # idle before each timed run: the warm pool refills only while no sandbox is in use


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(BatchSpanProcessor(_Drop()))
_SHIPPED = {name: getattr(metrics, name) for name in metrics.__all__ if callable(getattr(metrics, name))}
_SHIPPED_TRACING = {
    name: getattr(tracing, name)
    for name in ("span", "run_span", "lm_span", "lm_span_done", "lm_span_failed", "cell_done", "inject_headers")
}


@contextlib.contextmanager
def _null_span(*args: Any, **kwargs: Any) -> Iterator[trace.Span]:
    yield trace.INVALID_SPAN


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def set_mode(mode: str) -> None:
    """Swap the hooks the layers call (they look them up on the module at each call)."""
    for name, fn in _SHIPPED.items():
        setattr(metrics, name, _noop if mode == "off" else fn)
    for name, fn in _SHIPPED_TRACING.items():
        if mode == "off":
            replacement: Any = _null_span if name in ("span", "run_span", "lm_span") else _noop
            if name == "inject_headers":
                replacement = lambda headers: headers  # noqa: E731
            setattr(tracing, name, replacement)
        else:
            setattr(tracing, name, fn)
    # As shipped, no tracer until a provider is installed (OTEL_* asked): the helpers return at once.
    tracing._tracer = _PROVIDER.get_tracer("rlm_mcp") if mode == "metrics+tracing" else None


def hook_cost_us(mode: str, n: int = 20_000) -> tuple[float, float]:
    """Microseconds of the hooks one turn calls (its span, its root call's span, metrics and
    traceparent, one cell) and one sub-call calls (its LM span, metrics, traceparent)."""
    set_mode(mode)
    record = CallRecord("rlm-v0.1", 1200, 80, 0.001, "ok", "root")

    def lm_call(role: str) -> None:
        with tracing.lm_span(model="rlm-v0.1", role=role, endpoint="root", max_tokens=4096) as span:
            tracing.inject_headers({"X-Request-ID": "x"})
            metrics.lm_call("root", "rlm-v0.1", role, "ok", 0.001, 0.0, 1200, 80, 0)
            tracing.lm_span_done(span, record, "stop")

    def one_turn() -> None:
        with tracing.span("rlm.turn", {"rlm.turn": 1, "rlm.depth": 0}):
            lm_call("root")
            with tracing.span("rlm.cell", {"rlm.turn": 1, "rlm.cell.block": 0, "rlm.depth": 0}) as cell:
                metrics.cell_finished(0.0005, False)
                tracing.cell_done(cell, error=None, timed_out=False, restarted=False)

    out = []
    for fn in (one_turn, lambda: lm_call("sub")):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - started) / n * 1e6)
    return out[0], out[1]


async def whole_runs(repeat: int) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {m: {"one": [], "ten": [], "batch": []} for m in MODES}
    async with bench_service() as service:
        local = Caller(service, LOCAL_OWNER)
        ctx = await local.load_context(text="hello " * 1000)
        await timed_run(service, "one-turn warm-up", ctx.context_id, GAP_S)
        for _ in range(repeat):
            for mode in MODES:
                set_mode(mode)
                for kind, query in (("one", "one-turn"), ("ten", "ten-turn"), ("batch", "batch")):
                    times[mode][kind].append(await timed_run(service, query, ctx.context_id, GAP_S))
    set_mode("metrics")
    return times


def _med(values: list[float]) -> float:
    return statistics.median(values)


def report(repeat: int, loops: int) -> None:
    print(
        f"# bench/observability.py on {platform.node()} ({platform.machine()}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(f"\nhooks (CPU per call, median of 5 loops of {loops}):")
    hooks: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for _ in range(5):
        for mode in MODES:
            hooks[mode].append(hook_cost_us(mode, loops))
    for mode in MODES:
        turn = _med([t for t, _ in hooks[mode]])
        sub = _med([s for _, s in hooks[mode]])
        print(f"  {mode:<16} per turn {turn:7.2f} us   per sub-call {sub:7.2f} us")
    times = anyio.run(whole_runs, repeat)
    print(f"\nwhole runs ({repeat} of each, interleaved; min is the least disturbed by other load):")
    for stat, pick in (("min", min), ("median", _med)):
        base_turn = base_sub = 0.0
        for mode in MODES:
            t = times[mode]
            one = pick(t["one"])
            per_turn = (pick(t["ten"]) - one) / 9 * 1000
            per_sub = (pick(t["batch"]) - one) / 200 * 1000
            if mode == "off":
                base_turn, base_sub = per_turn, per_sub
            print(
                f"  {stat:<6} {mode:<16} one-turn run {one * 1000:6.1f} ms   per further turn {per_turn:5.2f} ms "
                f"({(per_turn / base_turn - 1) * 100:+5.1f} %)   per sub-call {per_sub:5.3f} ms "
                f"({(per_sub / base_sub - 1) * 100:+5.1f} %)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--loops", type=int, default=20_000)
    args = parser.parse_args()
    report(args.repeat, args.loops)


if __name__ == "__main__":
    main()
