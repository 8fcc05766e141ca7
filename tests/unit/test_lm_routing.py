"""Routing keys and the sub-call endpoint, against scripted servers (no router, no Docker).

Root calls carry the run id as the session key and echo an `x-session-token`; sub-calls carry
no affinity key and a fresh X-Request-ID per attempt; sub-calls may go to their own endpoint,
whose window, length field and extra body are its own; doctor and the pre-flight check name the
endpoint that fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.routing import AFFINITY_HEADERS
from rlm_mcp.ports.chat import LMConnectionError, LMModelNotFoundError
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_engine import FakeChatModel, repl, run_engine
from tests.fixtures_lm import FAST, ROOT_MESSAGES, lm_settings, run_with_client, sub_messages

pytestmark = pytest.mark.anyio

AFFINITY = {h.lower() for h in AFFINITY_HEADERS}


async def test_root_calls_carry_the_session_and_echo_the_token_sub_calls_carry_no_key() -> None:
    script = {"root": ["one", "two"], "session_token": "replica-7", "faults": [{"when": "sub", "times": 1}]}
    async with ScriptedLM(script) as lm:
        settings = lm_settings(lm, extra_body={"user": "someone"})  # never sent: routers hash it
        async with LMClient(settings.lm, backoff_base_s=FAST) as client:
            await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=64, role="root", session="run-1")
            await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=64, role="root", session="run-1")
            await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=64, role="root", session="run-2")
            await client.complete(sub_messages("q"), model="rlm-v0.1", max_tokens=8, role="sub")  # retried once
        first, second, other, *subs = lm.requests
        assert first["headers"]["x-session-id"] == "run-1" and "x-session-token" not in first["headers"]
        assert second["headers"]["x-session-token"] == "replica-7"  # echoed on the same run's next call
        assert other["headers"]["x-session-id"] == "run-2" and "x-session-token" not in other["headers"]
        assert [r["status"] for r in subs] == [500, 200]
        for sub in subs:
            assert not AFFINITY & set(sub["headers"]) and "x-session-token" not in sub["headers"]
        ids = [r["headers"]["x-request-id"] for r in lm.requests]
        assert len(set(ids)) == len(ids)  # the retry got a new one, so it may land elsewhere
        assert all("user" not in r["body"] for r in lm.requests)


async def test_session_header_is_configurable_and_can_be_turned_off() -> None:
    async with ScriptedLM({"root": ["x"]}) as lm:
        for overrides, expect in (
            ({"session_header": "X-Routing-Key"}, {"x-routing-key": "run-9"}),
            ({"session_affinity": False}, {}),
        ):
            lm.reset_log()
            async with LMClient(lm_settings(lm, **overrides).lm, backoff_base_s=FAST) as client:
                await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=8, role="root", session="run-9")
            headers = lm.requests[0]["headers"]
            assert {k: v for k, v in headers.items() if k in ("x-routing-key", *AFFINITY)} == expect


async def test_a_child_rlm_root_turns_carry_the_child_run_id(tmp_path: Path) -> None:
    def root(messages: list[dict[str, str]], index: int) -> str:
        if "child" in messages[1]["content"] or "Answer the following" not in messages[1]["content"]:
            return repl('answer["content"] = "leaf"\nanswer["ready"] = True')
        return repl('answer["content"] = rlm_query("go deeper")\nanswer["ready"] = True')

    lm = FakeChatModel(root=root)
    result, *_ = await run_engine(tmp_path, lm, max_depth=2)
    assert result.status == "completed" and result.answer == "leaf"
    sessions = [c.session for c in lm.root_calls]
    assert sessions[0] == result.run_id and sessions[1] == f"{result.run_id}.1", sessions
    assert lm.sessions_done == [f"{result.run_id}.1"]  # the child's end is told when it ends


async def test_root_and_sub_calls_on_two_endpoints(tmp_path: Path) -> None:
    code = (
        "a = llm_query_batched(['p1', 'p2'])\n"
        "b = llm_query('p3', model='big')\n"  # served by the root endpoint only
        "c = rlm_query('p4')\n"  # at the depth limit: a sub-call
        "answer['content'] = '|'.join(a + [b, c])\nanswer['ready'] = True"
    )
    root_script = {"root": [repl(code)], "extra_models": ["big"], "sub_default": "root:{prompt}", "max_model_len": 8192}
    sub_script = {"model": "small", "sub_default": "sub:{prompt}", "max_model_len": 4096}
    async with ScriptedLM(root_script) as root, ScriptedLM(sub_script) as sub:
        settings = lm_settings(
            root,
            sub_base_url=sub.base_url,
            sub_api_key="sub-key",
            sub_model="small",
            allowed_sub_models=["big"],
            sub_extra_body={"priority": 1},
            sub_completion_tokens_field="max_completion_tokens",
        )
        async with LMClient(settings.lm, backoff_base_s=FAST) as client:
            assert client.separate_sub_endpoint
            assert await client.window("small", role="sub") == 4096  # each endpoint's own window
            assert await client.window("rlm-v0.1") == 8192
            await client.check_model()
            result = await run_with_client(settings, client, tmp_path, code)
        assert result.status == "completed", result.reason
        assert result.answer == "sub:p1|sub:p2|root:p3|sub:p4"
        assert [r["role"] for r in root.requests] == ["root", "sub"]  # the root turn and the 'big' call
        assert [r["role"] for r in sub.requests] == ["sub"] * 3
        for request in sub.requests:
            assert request["headers"]["authorization"] == "Bearer sub-key"
            assert request["body"]["priority"] == 1 and "max_completion_tokens" in request["body"]
            assert "max_tokens" not in request["body"]
        assert "priority" not in root.requests[0]["body"] and "max_tokens" in root.requests[0]["body"]
        assert root.requests[0]["headers"]["x-session-id"] == "two"
        assert (
            result.usage.to_dict()["by_model"]["small"]["calls"] == 3
            and result.usage.to_dict()["by_model"]["big"]["calls"] == 1
        )


async def test_failures_name_the_endpoint_that_failed() -> None:
    async with ScriptedLM({"root": ["x"]}) as root:
        settings = lm_settings(root, sub_base_url="http://127.0.0.1:9/v1", sub_model="small")
        async with LMClient(settings.lm, backoff_base_s=FAST) as client:
            with pytest.raises(LMConnectionError) as caught:
                await client.check_model()
            text = str(caught.value)
            assert "sub-call endpoint at http://127.0.0.1:9/v1 is unreachable" in text
            assert "RLM_MCP_SUB_BASE_URL" in text
            probes = await client.probes()
            assert [(p.endpoint, p.reachable) for p in probes] == [("root", True), ("sub", False)]
            assert probes[0].kind == "vLLM" and probes[0].ok
        async with ScriptedLM({"model": "other"}) as sub:
            settings = lm_settings(root, sub_base_url=sub.base_url, sub_model="small")
            async with LMClient(settings.lm, backoff_base_s=FAST) as client:
                with pytest.raises(LMModelNotFoundError) as missing:
                    await client.check_model()
                assert f"'small' is not served at {sub.base_url}" in str(missing.value)
                assert "RLM_MCP_SUB_MODEL" in str(missing.value)
    # The root endpoint's kind is named once it is known.
    async with ScriptedLM({"root": ["x"]}) as gone:
        settings = lm_settings(gone, lm_retries=0)
        client = LMClient(settings.lm, backoff_base_s=FAST)
        await client.window("rlm-v0.1")  # discovery: the cards say vLLM
    try:
        with pytest.raises(LMConnectionError) as down:
            await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=8, role="root", session="r")
        assert f"The LM endpoint at {gone.base_url} (vLLM) is unreachable" in str(down.value)
        assert "RLM_MCP_BASE_URL" in str(down.value)
    finally:
        await client.aclose()


async def test_doctor_checks_both_endpoints_and_names_the_failing_one() -> None:
    from rlm_mcp.doctor import _lm

    async with ScriptedLM({"sub_default": "OK"}) as root, ScriptedLM({"model": "small", "sub_default": "OK"}) as sub:
        settings = lm_settings(root, sub_base_url=sub.base_url, sub_model="small")
        checks = {c.name: c for c in await _lm(settings)}
        assert checks["lm endpoint"].ok and checks["sub-call endpoint"].ok
        assert sub.base_url in checks["sub-call endpoint"].detail and "small" in checks["sub-call endpoint"].detail
        assert checks["completion"].ok and checks["sub-call completion"].ok
        assert checks["sub-call window"].detail == "16384 tokens" and not checks["sub-call window"].warn
        assert [r["model"] for r in sub.requests] == ["small"]  # the sub-call probe went to the sub endpoint
    async with ScriptedLM({"sub_default": "OK"}) as root:
        down = lm_settings(root, sub_base_url="http://127.0.0.1:9/v1", sub_model="small", lm_retries=0)
        checks = {c.name: c for c in await _lm(down)}
    assert checks["lm endpoint"].ok
    failing = checks["sub-call endpoint"]
    assert not failing.ok and "http://127.0.0.1:9/v1 is unreachable" in failing.detail
    assert "RLM_MCP_SUB_BASE_URL" in failing.fix


async def test_the_scripted_server_measures_prefix_reuse_per_session() -> None:
    from rlm_mcp.testing import count_prompt_tokens, count_text_tokens

    turn2 = [*ROOT_MESSAGES, {"role": "assistant", "content": "first reply"}, {"role": "user", "content": "Turn 2:"}]
    edited = [dict(m) for m in turn2]
    edited[1]["content"] = "Answer the following: what is y?"  # an earlier message changed
    async with ScriptedLM({"root": ["first reply"]}) as lm:
        async with LMClient(lm_settings(lm).lm, backoff_base_s=FAST) as client:
            for messages, session in ((ROOT_MESSAGES, "s"), (ROOT_MESSAGES, "t"), (turn2, "s"), (edited, "s")):
                await client.complete(messages, model="rlm-v0.1", max_tokens=64, role="root", session=session)
        first, second, third = lm.prefix.by_session("s")
        assert first.reused_tokens == 0 and lm.prefix.by_session("t")[0].reused_tokens == 0
        # Turn 2 reuses turn 1's prompt and completion; it prefills the reply's end token, the new
        # message and the generation prompt.
        assert second.reused_tokens == count_prompt_tokens(ROOT_MESSAGES) + count_text_tokens("first reply")
        assert second.prefilled == 1 + 4 + count_text_tokens("Turn 2:") + 3  # end, message, generation prompt
        # An edit in the second message: only the system message and the second's head are reused.
        assert 0 < third.reused_tokens < count_prompt_tokens(ROOT_MESSAGES[:2])


def test_sub_endpoint_settings_default_to_the_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlm_mcp.lm.endpoint import endpoint_configs

    base: dict[str, Any] = {"base_url": "http://gpu:8000/v1", "extra_body": {"a": 1}, "max_model_len": 8192}
    root, sub = endpoint_configs(make_settings(**base).lm)
    assert sub is None and root.max_model_len == 8192  # nothing differs: one endpoint
    root, sub = endpoint_configs(make_settings(**base, sub_base_url="http://gpu:8000/v1/").lm)
    assert sub is None  # the same address, written differently
    root, sub = endpoint_configs(make_settings(**base, sub_base_url="http://cheap:8000/v1").lm)
    assert sub is not None and sub.base_url == "http://cheap:8000/v1" and sub.extra_body == {"a": 1}
    assert (
        sub.max_model_len is None and sub.api_key == root.api_key == "EMPTY"
    )  # another server: its window is discovered
    monkeypatch.setenv("RLM_MCP_SUB_EXTRA_BODY", "{}")
    monkeypatch.setenv("RLM_MCP_SUB_MAX_MODEL_LEN", "4096")
    root, sub = endpoint_configs(make_settings(**base).lm)
    assert sub is not None and sub.base_url == root.base_url and sub.extra_body == {} and sub.max_model_len == 4096
    monkeypatch.setenv("RLM_MCP_SUB_EXTRA_BODY", "[1]")
    with pytest.raises(ValueError, match="RLM_MCP_SUB_EXTRA_BODY must be a JSON object"):
        make_settings(**base)


async def test_the_length_field_rule_and_the_key_are_per_endpoint() -> None:
    from rlm_mcp.testing.endpoints import OpenAI

    say = [{"role": "user", "content": "Say OK."}]
    with ScriptedLM({"model": "gpt-5-mini", "sub_default": "OK"}, endpoint=OpenAI(api_key="sk-sub")) as sub:
        async with ScriptedLM({"root": ["x"]}) as root:
            settings = lm_settings(root, sub_base_url=sub.base_url, sub_api_key="sk-sub", sub_model="gpt-5-mini")
            async with LMClient(settings.lm, backoff_base_s=FAST) as client:
                for _ in range(2):
                    await client.complete(say, model="gpt-5-mini", max_tokens=4, role="sub")
                    await client.complete(ROOT_MESSAGES, model="rlm-v0.1", max_tokens=4, role="root", session="r")
            # The sub endpoint refused max_tokens once, and is sent max_completion_tokens since;
            # the root endpoint (vLLM) keeps max_tokens.
            assert [("max_tokens" in r["body"], r["status"]) for r in sub.requests] == [
                (True, 400),
                (False, 200),
                (False, 200),
            ]
            assert all("max_tokens" in r["body"] for r in root.requests)
            assert all(r["headers"].get("authorization") == "Bearer EMPTY" for r in root.requests)
