"""The LM client's spans in process, recorded by the OpenTelemetry SDK into memory (the
provider is rlm-mcp's own, not the global one): the GenAI attributes of a call and of a failure,
the `traceparent` the scripted LM receives, prompt and completion text only with the capture
setting, and nothing at all (no header) while no provider is installed."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlm_mcp.lm.client import LMClient
from rlm_mcp.observability import tracing
from rlm_mcp.ports.chat import LMServerError
from rlm_mcp.testing.script import Fault, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_lm import lm_settings, sub_messages

pytestmark = pytest.mark.anyio

PROMPT = "a prompt that names the-private-detail"


async def _two_calls(lm: ScriptedLM) -> None:
    async with LMClient(lm_settings(lm, lm_retries=0).lm, backoff_base_s=0.01) as client:
        await client.complete(sub_messages(PROMPT), model="rlm-v0.1", max_tokens=64, role="sub")
        with pytest.raises(LMServerError):
            await client.complete(sub_messages("doomed"), model="rlm-v0.1", max_tokens=64, role="sub")


async def test_lm_spans_follow_the_genai_conventions_and_carry_no_text(
    recorded_spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    script = Script(sub_default="the answer", faults=[Fault(when="sub", status=503, times=0, match="doomed")])
    with ScriptedLM(script) as lm:
        await _two_calls(lm)
        headers = [r["headers"].get("traceparent") for r in lm.requests]
    ok, failed = recorded_spans.get_finished_spans()
    assert ok.name == failed.name == "chat rlm-v0.1"
    attrs = dict(ok.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "rlm-v0.1"
    input_tokens, output_tokens = attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]
    assert isinstance(input_tokens, int) and isinstance(output_tokens, int)
    assert input_tokens > 0 and output_tokens > 0
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["rlm.lm.role"] == "sub" and attrs["rlm.lm.endpoint"] == "root"
    assert dict(failed.attributes or {})["error.type"] == "server"
    assert failed.status.status_code.name == "ERROR"
    # sampled (and, for a trace the SDK began, its random-trace-id flag): 01 or 03
    assert headers[0] is not None and headers[0].startswith(
        f"00-{ok.context.trace_id:032x}-{ok.context.span_id:016x}-0"
    )
    assert all(h is not None for h in headers)
    assert "the-private-detail" not in str([s.to_json() for s in (ok, failed)])


async def test_the_capture_setting_records_prompt_and_completion(
    recorded_spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    script = Script(sub_default="the answer", faults=[Fault(when="sub", status=503, times=0, match="doomed")])
    with ScriptedLM(script) as lm:
        await _two_calls(lm)
    ok = recorded_spans.get_finished_spans()[0]
    attrs = dict(ok.attributes or {})
    assert "the-private-detail" in str(attrs["gen_ai.input.messages"])
    assert "the answer" in str(attrs["gen_ai.output.messages"])


async def test_without_a_provider_no_span_and_no_header() -> None:
    tracing.use_tracer_provider(None)
    with ScriptedLM(Script(sub_default="x")) as lm:
        async with LMClient(lm_settings(lm).lm) as client:
            await client.complete(sub_messages("hi"), model="rlm-v0.1", max_tokens=16, role="sub")
        assert "traceparent" not in lm.requests[0]["headers"]
    assert tracing.carrier() is None
