"""What reaches the trace store from text others chose (issue 41, finding 7 and the tracing lows),
with message capture off: a cell's `error.type` is a builtin exception name or `_OTHER`, never the
name of a class the model's code defined; a server span is named with the server's own method and
tool names, never a client's; a caller's unsampled `traceparent` is a parent, not a switch that
turns tracing off; and its `tracestate` never reaches the LM endpoint."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlm_mcp.lm.client import LMClient
from rlm_mcp.observability import tracing
from rlm_mcp.server.app import build_server
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_engine import FakeChatModel, cell, run_engine, submit
from tests.fixtures_lm import lm_settings, sub_messages

pytestmark = pytest.mark.anyio

SECRET = "ModelChosenSecretText"


def _dump(spans: tuple[ReadableSpan, ...]) -> str:
    return json.dumps([json.loads(s.to_json()) for s in spans])


async def test_a_cell_error_type_is_a_builtin_exception_name_or_other(
    recorded_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    lm = FakeChatModel(
        root=[
            cell(f"class {SECRET}Error(Exception):\n    pass\nraise {SECRET}Error('x')"),
            cell("1 / 0"),
            submit('"done"'),
        ]
    )
    result, _, _, _ = await run_engine(tmp_path, lm)
    assert result.status == "completed", result.reason
    cells = [s for s in recorded_spans.get_finished_spans() if s.name == "rlm.cell"]
    types = [dict(s.attributes or {}).get("error.type") for s in sorted(cells, key=lambda s: s.start_time or 0)]
    assert types == ["_OTHER", "ZeroDivisionError", None]
    assert SECRET not in _dump(recorded_spans.get_finished_spans())


async def test_server_spans_carry_only_the_servers_own_names(
    recorded_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    async with Client(build_server(make_settings(tmp_path))) as client:
        listed = await client.call_tool("rlm_list_contexts", {})
        assert not listed.is_error
        unknown = await client.call_tool(f"{SECRET}_tool", {})
        assert unknown.is_error
    spans = recorded_spans.get_finished_spans()
    calls = {s.name: dict(s.attributes or {}) for s in spans if s.name.startswith("tools/call")}
    assert set(calls) == {"tools/call rlm_list_contexts", "tools/call _OTHER"}
    assert calls["tools/call rlm_list_contexts"]["gen_ai.tool.name"] == "rlm_list_contexts"
    assert calls["tools/call _OTHER"]["gen_ai.tool.name"] == "_OTHER"
    assert calls["tools/call _OTHER"]["error.type"] == "tool_error"
    assert SECRET not in _dump(spans)


async def test_an_unsampled_caller_trace_is_a_parent_not_a_switch(
    recorded_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A demanding operator's expectation: whether rlm-mcp records a call is its own sampler's
    decision (OTEL_TRACES_SAMPLER); the caller's trace id and span are honoured as the parent."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    meta: Any = {"traceparent": f"00-{trace_id}-{span_id}-00", "tracestate": f"vendor={SECRET}"}
    async with Client(build_server(make_settings(tmp_path))) as client:
        assert not (await client.call_tool("rlm_list_contexts", {}, meta=meta)).is_error
    (call,) = [s for s in recorded_spans.get_finished_spans() if s.name == "tools/call rlm_list_contexts"]
    assert f"{call.context.trace_id:032x}" == trace_id and call.context.trace_flags.sampled
    assert call.parent is not None and f"{call.parent.span_id:016x}" == span_id
    assert SECRET not in _dump(recorded_spans.get_finished_spans())


async def test_a_callers_tracestate_never_reaches_the_lm_or_the_record(recorded_spans: InMemorySpanExporter) -> None:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    record_context = {"traceparent": f"00-{trace_id}-{span_id}-01", "tracestate": f"vendor={SECRET}"}
    with ScriptedLM(Script(sub_default="x")) as lm:
        async with LMClient(lm_settings(lm).lm) as client:
            with tracing.run_span(record_context, {"rlm.run.id": "r"}):
                carried = tracing.carrier()
                await client.complete(sub_messages("hi"), model="rlm-v0.1", max_tokens=16, role="sub")
        headers = lm.requests[0]["headers"]
    assert headers["traceparent"].split("-")[1] == trace_id
    assert "tracestate" not in headers
    assert carried is not None and set(carried) == {"traceparent"}
