"""Traces: a server exporting over OTLP/HTTP (only because OTEL_* variables ask) to Arize Phoenix,
queried through Phoenix's client: one trace per run, from the MCP call (continuing the caller's
`params._meta.traceparent`) through the run, its turns, LM calls with the GenAI conventions'
attributes, cells and sub-call batches; the scripted LM receiving `traceparent`; no prompt or
completion text in any span."""

from __future__ import annotations

import json
import secrets
from collections import Counter
from pathlib import Path
from typing import Any, cast

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import RequestParamsMeta

from rlm_mcp.observability import tracing
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.fixtures_phoenix import Phoenix

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

TOKEN = "traces-test-token"
SECRET = "the-secret-word-zebra"  # in the query, the context, prompts and replies: never in a span
TURNS = [
    "```repl\nparts = llm_query_batched(['first ' + context[:10], 'second ' + context[:10]])\nprint(parts)\n```",
    f'```repl\nanswer["content"] = "{SECRET}"\nanswer["ready"] = True\n```',
]


def _children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in spans if s["parent_id"] == parent["context"]["span_id"]]


def _one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, f"{name}: {[s['name'] for s in spans]}"
    return found[0]


async def _run(address: str, meta: dict[str, Any] | None) -> dict[str, Any]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=180)
    async with http, Client(streamable_http_client(f"http://{address}/mcp", http_client=http)) as client:
        loaded = await client.call_tool("rlm_load_context", {"text": f"{SECRET} is in here"})
        context_id = loaded.structured_content["context_id"]
        done = await client.call_tool(
            "rlm_complete",
            {"query": f"find {SECRET}", "context_id": context_id},
            meta=cast(RequestParamsMeta | None, meta),
        )
        assert done.structured_content is not None
        return done.structured_content


async def test_one_trace_per_run_from_the_mcp_call_to_the_lm(phoenix: Phoenix, tmp_path: Path) -> None:
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with ScriptedLM(Script(root=TURNS, sub_default=f"yes {SECRET}")) as lm:
        port = free_port()
        env = cli_env(
            tmp_path,
            RLM_MCP_BASE_URL=lm.base_url,
            RLM_MCP_AUTH_TOKEN=TOKEN,
            RLM_MCP_SANDBOX_MEMORY="256m",
            OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.base,
            OTEL_BSP_SCHEDULE_DELAY="200",
        )
        argv = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
        with server_process(argv, port=port, env=env, within_s=120):
            first = await _run(f"127.0.0.1:{port}", {"traceparent": f"00-{caller_trace}-{caller_span}-01"})
            second = await _run(f"127.0.0.1:{port}", None)
        assert first["status"] == second["status"] == "completed"
        requests = lm.requests

    ours = {first["run_id"], second["run_id"]}

    def run_spans() -> list[dict[str, Any]]:
        return [s for s in phoenix.spans() if s["name"] == "rlm.run" and s["attributes"].get("rlm.run.id") in ours]

    await wait_until(lambda: len(run_spans()) == 2, within_s=60, what="Phoenix to hold the spans of both runs")
    traces = {s["context"]["trace_id"] for s in run_spans()}
    spans = [s for s in phoenix.spans() if s["context"]["trace_id"] in traces]  # other tests share Phoenix
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["context"]["trace_id"], []).append(s)
    runs = [s for s in spans if s["name"] == "rlm.run"]
    assert len({r["context"]["trace_id"] for r in runs}) == 2  # one trace per run

    # The first run continues the caller's trace: the SDK's server span is the child of the
    # caller's span, and rlm-mcp's run span the child of the SDK's.
    trace = by_trace[caller_trace]
    call = _one(trace, "tools/call rlm_complete")
    assert call["parent_id"] == caller_span
    run = _one(trace, "rlm.run")
    assert run["parent_id"] == call["context"]["span_id"]
    assert run["attributes"]["rlm.run.id"] == first["run_id"]
    assert run["attributes"]["rlm.run.status"] == "completed"
    turns = sorted(_children(trace, run), key=lambda s: s["attributes"]["rlm.turn"])
    assert [t["name"] for t in turns] == ["rlm.turn", "rlm.turn"]
    for turn in turns:
        root_calls = [s for s in _children(trace, turn) if s["name"].startswith("chat ")]
        assert len(root_calls) == 1
        attrs = root_calls[0]["attributes"]
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "rlm-v0.1"
        assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["rlm.lm.role"] == "root"
        assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]
    cell = _one(_children(trace, turns[0]), "rlm.cell")
    batch = _one(_children(trace, cell), "rlm.sub_calls")
    assert batch["attributes"]["rlm.sub_calls.count"] == 2
    subs = _children(trace, batch)
    assert Counter(s["name"] for s in subs) == {"chat rlm-v0.1": 2}
    assert {s["attributes"]["rlm.lm.role"] for s in subs} == {"sub"}

    # The second run: a trace of its own, rooted at the SDK's server span.
    other = by_trace[next(r["context"]["trace_id"] for r in runs if r is not run)]
    assert _one(other, "tools/call rlm_complete")["parent_id"] is None
    assert _one(other, "rlm.run")["attributes"]["rlm.run.id"] == second["run_id"]

    # Every LM request carried its span's context to the endpoint.
    lm_spans = {s["context"]["span_id"]: s for s in spans if s["name"].startswith("chat ")}
    for request in requests:
        version, trace_id, span_id, _flags = request["headers"]["traceparent"].split("-")
        assert version == "00" and span_id in lm_spans
        assert lm_spans[span_id]["context"]["trace_id"] == trace_id
    assert sum(1 for r in requests if r["headers"]["traceparent"].split("-")[1] == caller_trace) == 4
    # No prompt, completion or query text was recorded (the capture setting is off).
    assert SECRET not in json.dumps(spans)


def test_traces_are_off_unless_the_otel_variables_ask() -> None:
    assert not tracing.wants_traces({})
    assert tracing.wants_traces({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wants_traces({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert tracing.wants_traces({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.wants_traces({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing.wants_traces({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


async def test_an_http_traceparent_header_is_continued_like_meta(phoenix: Phoenix, tmp_path: Path) -> None:
    header_trace, header_span = secrets.token_hex(16), secrets.token_hex(8)
    port = free_port()
    env = cli_env(
        tmp_path,
        RLM_MCP_BASE_URL="http://127.0.0.1:9/v1",
        RLM_MCP_AUTH_TOKEN=TOKEN,
        OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.base,
        OTEL_BSP_SCHEDULE_DELAY="200",
    )
    argv = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
    headers = {"Authorization": f"Bearer {TOKEN}", "traceparent": f"00-{header_trace}-{header_span}-01"}
    with server_process(argv, port=port, env=env, within_s=120):
        http = httpx2.AsyncClient(headers=headers, timeout=60)
        async with http, Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client:
            await client.call_tool("rlm_load_context", {"text": "header-carried"})

    def loaded() -> list[dict[str, Any]]:
        return [
            s
            for s in phoenix.spans()
            if s["name"] == "tools/call rlm_load_context" and s["context"]["trace_id"] == header_trace
        ]

    await wait_until(lambda: len(loaded()) == 1, within_s=60, what="the tool call's span in the caller's trace")
    assert loaded()[0]["parent_id"] == header_span
