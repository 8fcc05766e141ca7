"""The engine against the real LM client and the scripted OpenAI-compatible HTTP server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine, RunProgress
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.events import HistoryElided, LLMCall, RunEvent
from rlm_mcp.lm.client import LMClient
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.script import count_prompt_tokens
from tests.fixtures_engine import FakeSandboxFactory, make_context, make_limits, repl

pytestmark = pytest.mark.anyio


async def _run(server: ScriptedLM, tmp_path: Path, **limits: object) -> tuple:
    settings = Settings(base_url=server.base_url, model="rlm-v0.1", lm_retries=1, request_timeout_s=30.0)
    events: list[RunEvent] = []

    async def sink(event: RunEvent) -> None:
        events.append(event)

    async with LMClient(settings.lm, backoff_base_s=0.01) as client:
        engine = RLMEngine(settings.engine, client, FakeSandboxFactory(), system_prompt=RLM_MCP_SYSTEM_PROMPT)
        lim = make_limits(settings, **limits)
        result = await engine.run(
            run_id="h",
            query="What is the magic number?",
            contexts=[make_context(tmp_path)],
            limits=lim,
            progress=RunProgress(run_id="h", max_iterations=lim.max_iterations),
            emit=sink,
        )
    return result, events


async def test_http_run_with_sub_calls_and_exact_usage(tmp_path: Path) -> None:
    script = {
        "root": [
            repl("r = llm_query_batched(['find it: ' + context[:50], 'again'])\nprint(r)"),
            repl('answer["content"] = r[0]\nanswer["ready"] = True'),
        ],
        "sub": [{"match": "find it", "reply": "42"}],
        "sub_default": "no",
    }
    async with ScriptedLM(script) as server:
        result, events = await _run(server, tmp_path)
        assert result.status == "completed" and result.answer == "42"
        assert result.usage.to_dict()["total"]["calls"] == 4 == len(server.requests)
        expected = sum(count_prompt_tokens(r["body"]["messages"]) for r in server.requests)
        assert result.usage.to_dict()["total"]["prompt_tokens"] == expected


async def test_http_many_big_outputs_never_overflow(tmp_path: Path) -> None:
    script = {"root": [repl(f"print('{i}' * 30000)") for i in range(10)], "max_model_len": 16384}
    async with ScriptedLM(script) as server:
        result, events = await _run(server, tmp_path, max_iterations=8)
        assert result.status == "max_iterations", result.reason
        assert [e for e in events if isinstance(e, HistoryElided)]
        assert all(e.status == "ok" for e in events if isinstance(e, LLMCall))


async def test_sub_prompts_are_refused_only_against_a_window_the_server_reported(tmp_path: Path) -> None:
    big = repl("r = llm_query('look: ' + 'x' * 100_000)\nanswer['content'] = r\nanswer['ready'] = True")
    # No /v1/models: the window is unknown, so the server decides (this one takes 64k tokens).
    lenient = {"root": [big], "sub_default": "took it", "models_endpoint": False, "max_model_len": 65536}
    async with ScriptedLM(lenient) as server:
        result, _ = await _run(server, tmp_path)
        assert result.answer == "took it"
    # The server reports 16384 tokens: the prompt is refused with a clear message, never sent.
    strict = {"root": [big], "sub_default": "took it", "max_model_len": 16384}
    async with ScriptedLM(strict) as server:
        result, _ = await _run(server, tmp_path)
        assert result.answer.startswith("Error: this prompt is") and "smaller chunks" in result.answer
        assert server.requests_by_role("sub") == []
    # Unknown window and a server that rejects it: the server's reason reaches the code.
    rejecting = {"root": [big], "models_endpoint": False, "max_model_len": 16384}
    async with ScriptedLM(rejecting) as server:
        result, _ = await _run(server, tmp_path)
        assert "too large for the sub-LLM's window" in result.answer
        assert "maximum context length is 16384" in result.answer
