"""A loopback OpenAI-compatible endpoint that refuses load: past `limit` calls in flight it
answers 429 (as hosted endpoints do), and it counts what it saw. Root calls (a system message
first) get the cells of a run that makes one `batch`-way `llm_query_batched`, sub-calls "fine";
every answered call takes `hold_s`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from rlm_mcp.events import LoggedEvent
from rlm_mcp.testing.servers import free_port
from tests.fixtures_engine import repl, run_at_endpoint


@dataclass
class Refusals:
    limit: int
    batch: int
    hold_s: float = 0.05
    in_flight: int = 0
    most_in_flight: int = 0  # among the calls it answered (never above `limit`)
    answered: int = 0
    refused: int = 0  # calls that arrived past the limit: the overflow
    refusing: bool = True  # False: a storm that cleared (answers everything)
    retry_after_ms: int = 50  # what a refusal asks the caller to wait
    arrivals: list[int] = field(default_factory=list)  # in flight as each call arrived

    def reply(self, body: dict[str, object]) -> str:
        messages = body.get("messages")
        assert isinstance(messages, list)
        if not messages or messages[0].get("role") != "system":
            return "fine"
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        if turn == 1:
            return repl(f"r = llm_query_batched([f'part {{i}}' for i in range({self.batch})])\nprint(len(r))")
        return repl('answer["content"] = "done"\nanswer["ready"] = True')


@asynccontextmanager
async def refusing_endpoint(state: Refusals) -> AsyncIterator[str]:
    """Serve `state`'s endpoint on loopback; yield its /v1 URL."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        state.arrivals.append(state.in_flight)
        if state.refusing and state.in_flight >= state.limit:
            state.refused += 1
            return web.json_response(
                {"error": {"message": "Too many requests", "type": "rate_limit"}},
                status=429,
                headers={"retry-after-ms": str(state.retry_after_ms)},
            )
        state.in_flight += 1
        state.most_in_flight = max(state.most_in_flight, state.in_flight)
        try:
            await asyncio.sleep(state.hold_s)
        finally:
            state.in_flight -= 1
        state.answered += 1
        text = state.reply(body)
        return web.json_response(
            {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": len(json.dumps(text)) // 4, "total_tokens": 20},
            }
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "rlm-v0.1", "object": "model", "max_model_len": 16384}]}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def throttled_run(tmp_path: Path) -> tuple[Refusals, list[LoggedEvent]]:
    """One run making a 32-way batch against an endpoint that refuses past 4 in flight."""
    state = Refusals(limit=4, batch=32)
    async with refusing_endpoint(state) as url:
        result, events = await run_at_endpoint(
            tmp_path, url, run_id="run_t", max_iterations=3, lm_retries=1, backoff_base_s=0.05, timeout_s=120
        )
    assert result.status == "completed"
    return state, list(events)
