"""The scripted server's endpoint personalities answer as those servers do, and the LM client reads
what each really reports (window, refused parameters, auth)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.lm.catalog import ModelCatalog
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.endpoint import Endpoint, endpoint_configs
from rlm_mcp.lm.server_kind import guess_server_kind
from rlm_mcp.testing.endpoints import VLLM, LlamaCpp, LMStudio, Ollama, OpenAI, OpenRouter
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM

pytestmark = pytest.mark.anyio

SAY = [{"role": "user", "content": "Say OK."}]
REPLY = "OK, that works."  # four scripted tokens (4 bytes each)


async def served_cards(settings: Settings) -> list[dict[str, Any]] | None:
    """The root endpoint's /v1/models cards, read as the LM client's catalog reads them."""
    endpoint = Endpoint(endpoint_configs(settings.lm)[0], request_timeout_s=settings.lm.request_timeout_s)
    try:
        return await ModelCatalog(endpoint).cards()
    finally:
        await endpoint.aclose()


def script(model: str, window: int = 16384) -> Script:
    return Script(model=model, base_model=model, max_model_len=window, sub_default=REPLY)


def test_ollama_lists_names_with_colons_and_no_window() -> None:
    with ScriptedLM(script("qwen3:8b"), endpoint=Ollama()) as lm:
        cards = httpx.get(f"{lm.base_url}/models").json()["data"]
        assert cards == [{"id": "qwen3:8b", "object": "model", "created": cards[0]["created"], "owned_by": "library"}]
        assert httpx.post(f"{lm.root_url}/tokenize", json={}).status_code == 404
        long = "x" * 200_000  # 50,000 tokens into a 16,384 window: kept silently, not refused
        reply = httpx.post(
            f"{lm.base_url}/chat/completions",
            json={"model": "qwen3:8b", "messages": [{"role": "user", "content": long}], "max_tokens": 8},
        )
        assert reply.status_code == 200
        assert reply.json()["usage"]["prompt_tokens"] < 16384


def test_openai_needs_its_key_and_refuses_max_tokens_with_its_own_body() -> None:
    with ScriptedLM(script("gpt-5-mini"), endpoint=OpenAI(api_key="sk-good")) as lm:
        anonymous = httpx.get(f"{lm.base_url}/models")
        assert anonymous.status_code == 401
        assert "You didn't provide an API key" in anonymous.json()["error"]["message"]
        auth = {"Authorization": "Bearer sk-good"}
        assert httpx.get(f"{lm.base_url}/models", headers=auth).json()["data"][0]["owned_by"] == "system"
        body = {"model": "gpt-5-mini", "messages": SAY}
        refused = httpx.post(f"{lm.base_url}/chat/completions", headers=auth, json={**body, "max_tokens": 1})
        assert refused.status_code == 400
        assert refused.json() == OpenAI.REFUSED_MAX_TOKENS
        taken = httpx.post(f"{lm.base_url}/chat/completions", headers=auth, json={**body, "max_completion_tokens": 1})
        assert taken.status_code == 200


def test_openrouter_lists_context_length_publicly_under_api_v1() -> None:
    with ScriptedLM(script("qwen/qwen3-30b-a3b", 40960), endpoint=OpenRouter(api_key="sk-or-good")) as lm:
        assert lm.base_url.endswith("/api/v1")
        card = httpx.get(f"{lm.base_url}/models").json()["data"][0]
        assert card["context_length"] == 40960 and "owned_by" not in card
        chat = httpx.post(f"{lm.base_url}/chat/completions", json={"model": card["id"], "messages": SAY})
        assert chat.status_code == 401 and chat.json()["error"]["message"] == "No auth credentials found"


def test_llamacpp_props_window_any_model_name_and_its_overflow_body() -> None:
    with ScriptedLM(script("local", 8192), endpoint=LlamaCpp(api_key="k")) as lm:
        card = httpx.get(f"{lm.base_url}/models").json()["data"][0]  # public despite the key
        assert card["owned_by"] == "llamacpp" and card["meta"]["n_ctx_train"] > 8192
        assert httpx.get(f"{lm.root_url}/props").status_code == 401
        props = httpx.get(f"{lm.root_url}/props", headers={"Authorization": "Bearer k"}).json()
        assert props["default_generation_settings"]["n_ctx"] == 8192
        auth = {"Authorization": "Bearer k"}
        # Any model name is answered; max_completion_tokens is not read (the reply is not cut to 1).
        ok = httpx.post(
            f"{lm.base_url}/chat/completions",
            headers=auth,
            json={"model": "whatever", "messages": SAY, "max_completion_tokens": 1},
        )
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == REPLY
        over = httpx.post(
            f"{lm.base_url}/chat/completions",
            headers=auth,
            json={"model": "local", "messages": [{"role": "user", "content": "y" * 40_000}]},
        )
        assert over.status_code == 400 and over.json()["error"]["type"] == "exceed_context_size_error"


def test_vllm_key_guards_v1_only() -> None:
    with ScriptedLM(Script(), endpoint=VLLM(api_key="k")) as lm:
        assert httpx.get(f"{lm.base_url}/models").status_code == 401
        assert httpx.get(f"{lm.root_url}/health").status_code == 200
        cards = httpx.get(f"{lm.base_url}/models", headers={"Authorization": "Bearer k"}).json()["data"]
        assert {c["owned_by"] for c in cards} == {"vllm"} and any(c["parent"] for c in cards)


@pytest.mark.parametrize(
    ("endpoint", "model", "kind"),
    [
        (VLLM(), "rlm-v0.1", "vLLM"),
        (Ollama(), "qwen3:8b", "Ollama"),
        (OpenAI(api_key="EMPTY"), "gpt-5", "OpenAI"),
        (OpenRouter(api_key="EMPTY"), "qwen/qwen3-8b", "OpenRouter"),
        (LMStudio(), "qwen/qwen3-8b", "LM Studio"),
        (LlamaCpp(), "local", "llama.cpp server"),
    ],
)
async def test_server_kind_from_each_personality(endpoint: object, model: str, kind: str) -> None:
    with ScriptedLM(script(model), endpoint=endpoint) as lm:  # type: ignore[arg-type]
        assert guess_server_kind(lm.base_url, await served_cards(Settings(base_url=lm.base_url, model=model))) == kind


@pytest.mark.parametrize(
    ("endpoint", "model", "known"),
    [
        (OpenRouter(api_key="EMPTY"), "qwen/qwen3-8b", True),
        (LlamaCpp(), "local", True),
        (Ollama(), "qwen3:8b", False),
        (LMStudio(), "qwen/qwen3-8b", False),
        (OpenAI(api_key="EMPTY"), "gpt-5", False),
    ],
)
async def test_window_is_read_where_the_endpoint_reports_it(endpoint: object, model: str, known: bool) -> None:
    with ScriptedLM(script(model, 12288), endpoint=endpoint) as lm:  # type: ignore[arg-type]
        async with LMClient(Settings(base_url=lm.base_url, model=model).lm) as client:
            assert await client.window_known(model) is known
            assert await client.window(model) == (12288 if known else 16384)


async def test_openai_auto_switches_to_max_completion_tokens_and_a_bad_key_names_the_fix() -> None:
    with ScriptedLM(script("gpt-5-mini"), endpoint=OpenAI(api_key="sk-good")) as lm:
        async with LMClient(Settings(base_url=lm.base_url, model="gpt-5-mini", api_key="sk-good").lm) as client:
            done = await client.complete(SAY, model="gpt-5-mini", max_tokens=1, role="sub")
            assert done.text == "OK, "  # cut to the one token asked for
        sent = [r["body"] for r in lm.requests]
        assert "max_tokens" in sent[0] and "max_completion_tokens" in sent[1]
        async with LMClient(Settings(base_url=lm.base_url, model="gpt-5-mini", api_key="sk-bad").lm) as client:
            with pytest.raises(RlmMcpError) as refused:
                await client.check_model()
            assert "401" in str(refused.value) and "RLM_MCP_API_KEY" in (refused.value.fix or "")
