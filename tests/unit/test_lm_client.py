"""LMClient against the scripted OpenAI-compatible server over loopback."""

from __future__ import annotations

import json

import anyio
import pytest

from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.tokens import estimate_tokens
from rlm_mcp.ports.chat import (
    LMConnectionError,
    LMContextLengthError,
    LMMalformedResponseError,
    LMModelNotFoundError,
    LMRequestError,
    LMServerError,
)
from rlm_mcp.ports.runs import Usage
from rlm_mcp.testing import Script, ScriptedLM, count_prompt_tokens, count_text_tokens
from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_lm import ROOT_MESSAGES, lm_settings, sub_messages
from tests.fixtures_store import LoopbackServer

pytestmark = pytest.mark.anyio

FAST = 0.01  # backoff base in tests: retries without waiting


def client_for(lm: ScriptedLM | str, **overrides: object) -> LMClient:
    return LMClient(lm_settings(lm, **overrides).lm, backoff_base_s=FAST)


async def test_complete_root_reports_text_usage_and_body() -> None:
    async with ScriptedLM({"root": ["```repl\nprint(len(context))\n```"]}) as lm:
        client = client_for(lm, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        try:
            out = await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=4096, role="root")
        finally:
            await client.aclose()
        assert out.text == "```repl\nprint(len(context))\n```"
        assert out.finish_reason == "stop"
        rec = out.record
        assert (rec.model, rec.role, rec.status, rec.estimated) == ("rlm-v0.1", "root", "ok", False)
        assert rec.prompt_tokens == count_prompt_tokens(ROOT_MESSAGES)
        assert rec.completion_tokens == count_text_tokens(out.text)
        body = lm.requests[0]["body"]
        assert body["max_tokens"] == 4096 and "max_completion_tokens" not in body
        assert body["stream"] is False
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["messages"] == ROOT_MESSAGES


async def test_sub_call_routing_and_min_max_tokens() -> None:
    script = {"root": ["root reply"], "sub": [{"match": r"capital of (\w+)", "reply": "capital(\\1)"}]}
    async with ScriptedLM(script) as lm:
        async with client_for(lm) as client:
            out = await client.complete(
                sub_messages("the capital of France?"), model="rlm-v0.1", max_tokens=100, role="sub"
            )
            cut = await client.complete(
                sub_messages("the capital of Peru?"), model="rlm-v0.1", max_tokens=0, role="sub"
            )
        assert out.text == "capital(France)" and out.finish_reason == "stop"
        assert out.record.role == "sub"
        assert lm.requests[0]["role"] == "sub"
        assert lm.requests[1]["body"]["max_tokens"] == 1  # clamped to at least one token
        assert cut.finish_reason == "length" and cut.text == "capi"  # one scripted token = 4 bytes


async def test_window_discovered_from_adapter_parent_and_cached() -> None:
    async with ScriptedLM({"max_model_len": 8192}) as lm:
        async with client_for(lm) as client:
            assert await client.window("rlm-v0.1") == 8192  # adapter entry is null: its parent's
            assert await client.window("rlm-v0.1") == 8192
            assert await client.window(lm.script.base_model) == 8192
            assert await client.window_known("rlm-v0.1") is True
        assert lm.hits["/v1/models"] == 1


async def test_window_setting_overrides_discovery() -> None:
    async with ScriptedLM({"max_model_len": 8192}) as lm:
        async with client_for(lm, max_model_len=4000) as client:
            assert await client.window("rlm-v0.1") == 4000
            assert await client.window_known("rlm-v0.1") is True
        assert lm.hits["/v1/models"] == 0


async def test_window_falls_back_without_models_endpoint() -> None:
    async with ScriptedLM({"models_endpoint": False, "max_model_len": 8192}) as lm, client_for(lm) as client:
        assert await client.window("rlm-v0.1") == 16384
        assert await client.window_known("rlm-v0.1") is False


async def test_window_falls_back_when_unreachable() -> None:
    async with client_for(closed_port_url()) as client:
        assert await client.window("rlm-v0.1") == 16384


async def test_count_tokens_uses_tokenize() -> None:
    async with ScriptedLM() as lm:
        async with client_for(lm) as client:
            n = await client.count_tokens(ROOT_MESSAGES, model="rlm-v0.1")
        assert n == count_prompt_tokens(ROOT_MESSAGES)
        assert lm.hits["/tokenize"] == 1


async def test_count_tokens_estimates_without_tokenize_and_remembers() -> None:
    messages = [*ROOT_MESSAGES, {"role": "user", "content": "x" * 5000 + " 日本語のテキスト" * 50}]
    async with ScriptedLM({"tokenize": False}) as lm:
        async with client_for(lm) as client:
            first = await client.count_tokens(messages, model="rlm-v0.1")
            second = await client.count_tokens(messages, model="rlm-v0.1")
        assert first == second == estimate_tokens(messages)
        assert first >= count_prompt_tokens(messages)  # the estimate over-counts
        assert lm.hits["/tokenize"] == 1  # the 404 was remembered


@pytest.mark.parametrize("status", [500, 503, 429, 408])
async def test_transient_errors_are_retried(status: int) -> None:
    script = {"sub_default": "fine", "faults": [{"when": "sub", "status": status, "times": 2}]}
    async with ScriptedLM(script) as lm:
        async with client_for(lm) as client:
            out = await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
        assert out.text == "fine"
        assert [r["status"] for r in lm.requests] == [status, status, 200]


async def test_retry_after_is_honoured_and_dropped_connections_retried() -> None:
    script = {"faults": [{"status": 429, "retry_after": 0.05, "times": 1}, {"drop": True, "times": 1}]}
    async with ScriptedLM(script) as lm:
        async with client_for(lm) as client:
            out = await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
        assert out.text == "ok"
        assert [r["status"] for r in lm.requests] == [429, "dropped", 200]


async def test_retries_are_bounded() -> None:
    async with ScriptedLM({"faults": [{"status": 500, "times": 0}]}) as lm:
        async with client_for(lm, lm_retries=2) as client:
            with pytest.raises(LMServerError) as info:
                await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
        assert len(lm.requests) == 3
        err = info.value
        assert err.status == 500 and lm.base_url in str(err)
        assert err.record is not None and err.record.status == "error" and err.record.role == "sub"


async def test_context_length_error_is_not_retried() -> None:
    async with ScriptedLM({"max_model_len": 64}) as lm:
        async with client_for(lm) as client:
            with pytest.raises(LMContextLengthError) as info:
                await client.complete(sub_messages("x" * 1000), model="rlm-v0.1", max_tokens=10, role="sub")
            assert "maximum context length is 64 tokens" in (info.value.server_message or "")
            with pytest.raises(LMContextLengthError) as info:
                await client.complete(sub_messages("x"), model="rlm-v0.1", max_tokens=100, role="sub")
            assert "cannot be greater than max_model_len=64" in (info.value.server_message or "")
        assert len(lm.requests) == 2  # one attempt each


async def test_other_400_is_not_retried() -> None:
    async with ScriptedLM({"faults": [{"status": 400, "body": "bad field", "times": 0}]}) as lm:
        async with client_for(lm) as client:
            with pytest.raises(LMRequestError) as info:
                await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
        assert "bad field" in str(info.value) and info.value.status == 400
        assert not info.value.retryable
        assert len(lm.requests) == 1


async def test_unknown_model_names_the_served_models() -> None:
    async with ScriptedLM() as lm:
        async with client_for(lm) as client:
            with pytest.raises(LMModelNotFoundError) as info:
                await client.complete(sub_messages("q"), model="nope", max_tokens=10, role="sub")
        text = str(info.value)
        assert "'nope'" in text and "rlm-v0.1" in text and lm.script.base_model in text
        assert "RLM_MCP_MODEL" in text
        assert len(lm.requests) == 1


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"  # bound and released: nothing listens there


async def test_unreachable_endpoint_is_a_connection_error_with_the_fix() -> None:
    url = closed_port_url()
    async with client_for(url, lm_retries=1) as client:
        with pytest.raises(LMConnectionError) as info:
            await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
        text = str(info.value)
        assert url in text and "unreachable" in text and "RLM_MCP_BASE_URL" in text and "vllm serve" in text
        with pytest.raises(LMConnectionError):
            await client.check_model()
        probe = await client.probe()
        assert probe.reachable is False and probe.ok is False and "unreachable" in (probe.error or "")


@pytest.mark.parametrize("kind", ["json", "no_choices"])
async def test_malformed_response(kind: str) -> None:
    async with ScriptedLM({"faults": [{"malformed": kind, "times": 0}]}) as lm:
        async with client_for(lm) as client:
            with pytest.raises(LMMalformedResponseError) as info:
                await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
        assert lm.base_url in str(info.value)


async def test_missing_usage_is_estimated_and_marked() -> None:
    async with ScriptedLM({"usage": False, "sub_default": "an answer"}) as lm, client_for(lm) as client:
        out = await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
    assert out.text == "an answer"
    assert out.record.estimated is True
    assert out.record.prompt_tokens > 0 and out.record.completion_tokens > 0


async def test_reasoning_content_fallback() -> None:
    async with ScriptedLM({"reasoning_content": True, "sub_default": "thought"}) as lm, client_for(lm) as client:
        out = await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=10, role="sub")
    assert out.text == "thought"


async def test_concurrency_is_bounded_across_roles() -> None:
    async with ScriptedLM({"delay_s": 0.05, "root": ["r"]}) as lm:
        async with client_for(lm, max_concurrent_lm_calls=3) as client:
            results: list[str] = []

            async def call(i: int) -> None:
                if i % 4 == 0:
                    out = await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=10, role="root")
                else:
                    out = await client.complete(sub_messages(f"q{i}"), model="rlm-v0.1", max_tokens=10, role="sub")
                results.append(out.text)

            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(call, i)
        assert len(results) == 12
        assert 1 < lm.max_in_flight <= 3


async def slow_call(client: LMClient) -> None:
    await client.complete(sub_messages("slow"), model="rlm-v0.1", max_tokens=10, role="sub")


async def test_cancelling_complete_closes_the_request() -> None:
    async with ScriptedLM({"delay_s": 60}) as lm:
        async with client_for(lm) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(slow_call, client)
                await wait_until(lambda: lm.requests, what="the request reaching the server")
                tg.cancel_scope.cancel()
            # The server saw the client go away (vLLM aborts the generation then).
            await wait_until(lambda: lm.disconnects >= 1, what="the server seeing the disconnect")
        assert lm.requests[0]["disconnected"] is True


async def test_check_model_and_probe() -> None:
    async with ScriptedLM({"max_model_len": 8192}) as lm:
        async with client_for(lm) as client:
            await client.check_model()
            probe = await client.probe()
        assert probe.ok and probe.reachable and probe.model_served and probe.sub_model_served
        assert probe.models == [lm.script.base_model, "rlm-v0.1"]
        assert probe.max_model_len == 8192 and probe.health is True and probe.tokenize is True

        async with client_for(lm, model="missing-adapter") as client:
            with pytest.raises(LMModelNotFoundError) as info:
                await client.check_model()
            probe = await client.probe()
        text = str(info.value)
        assert "'missing-adapter'" in text and "rlm-v0.1" in text and "RLM_MCP_MODEL" in text
        assert probe.model_served is False and not probe.ok and "missing-adapter" in (probe.error or "")

        async with client_for(lm, sub_model="missing-sub") as client:
            with pytest.raises(LMModelNotFoundError, match="missing-sub"):
                await client.check_model()


async def test_check_model_passes_without_models_endpoint() -> None:
    async with ScriptedLM({"models_endpoint": False, "tokenize": False, "health": False}) as lm:
        async with client_for(lm, model="anything") as client:
            await client.check_model()
            probe = await client.probe()
        assert probe.reachable and probe.models is None and probe.model_served is None
        assert probe.health is None and probe.tokenize is False


def test_script_model_roundtrip() -> None:
    script = Script(root=["a"], faults=[{"status": 429}])
    assert Script.model_validate_json(script.model_dump_json()) == script


def test_client_satisfies_the_engine_port() -> None:
    from rlm_mcp.ports import ChatModel

    client = LMClient(lm_settings("http://127.0.0.1:9/v1").lm)  # nothing connects here
    assert isinstance(client, ChatModel)  # every method of the port, by name (runtime_checkable)


async def test_an_unreadable_body_is_a_malformed_response_not_a_crash(http_server: LoopbackServer) -> None:
    http_server.route(
        "/v1/chat/completions", b"this is not gzip at all", Content_Type="application/json", Content_Encoding="gzip"
    )
    async with client_for(http_server.url("/v1")) as client:
        with pytest.raises(LMMalformedResponseError, match="could not be read"):
            await client.complete(sub_messages("x"), model="rlm-v0.1", max_tokens=8, role="sub")


OPENAI_REFUSAL = (
    "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
)


async def test_auto_switches_to_max_completion_tokens_where_max_tokens_is_refused() -> None:
    async with ScriptedLM({"root": ["ok"], "faults": [{"status": 400, "body": OPENAI_REFUSAL, "times": 1}]}) as lm:
        async with client_for(lm) as client:
            first = await client.complete(sub_messages("a"), model="rlm-v0.1", max_tokens=50, role="sub")
            second = await client.complete(sub_messages("b"), model="rlm-v0.1", max_tokens=60, role="sub")
        assert first.text and second.text
        bodies = [r["body"] for r in lm.requests]
        assert [("max_tokens" in b, b.get("max_completion_tokens")) for b in bodies] == [
            (True, None),
            (False, 50),
            (False, 60),  # retried once, then remembered for the model
        ]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_a_fixed_field_is_always_sent_and_never_switched(field: str) -> None:
    async with ScriptedLM({"faults": [{"status": 400, "body": OPENAI_REFUSAL, "times": 1}]}) as lm:
        async with client_for(lm, completion_tokens_field=field) as client:
            with pytest.raises(Exception, match="Unsupported parameter"):
                await client.complete(sub_messages("a"), model="rlm-v0.1", max_tokens=50, role="sub")
            await client.complete(sub_messages("b"), model="rlm-v0.1", max_tokens=50, role="sub")
        assert [set(r["body"]) & {"max_tokens", "max_completion_tokens"} for r in lm.requests] == [{field}, {field}]


async def test_prompt_tokens_served_from_the_prefix_cache_are_counted(http_server: LoopbackServer) -> None:
    reply = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 3,
            "total_tokens": 123,
            "prompt_tokens_details": {"cached_tokens": 96},
        },
    }
    http_server.route("/v1/chat/completions", json.dumps(reply).encode(), Content_Type="application/json")
    async with client_for(http_server.url("/v1")) as client:
        done = await client.complete(sub_messages("x"), model="rlm-v0.1", max_tokens=8, role="sub")
    assert (done.record.prompt_tokens, done.record.cached_prompt_tokens) == (120, 96)
    usage = Usage()
    usage.add_call(done.record)
    assert usage.to_dict()["total"] == {
        "prompt_tokens": 120,
        "completion_tokens": 3,
        "calls": 1,
        "cached_prompt_tokens": 96,
    }
