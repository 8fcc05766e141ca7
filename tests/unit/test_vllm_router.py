"""rlm-mcp behind the real `vllm-router --policy consistent_hash` over three scripted backends:
a run's root turns stay on one replica (its prefix cache), its sub-calls spread over all three,
and a replica killed mid-run costs retries, not the run (and no usage is counted twice)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine, RunProgress, RunResult
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.events import LLMCall, RunEvent
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.routing import AFFINITY_HEADERS
from rlm_mcp.ports import ContextSpec, LMBridge
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_engine import FakeSandboxFactory, make_context, make_limits, repl
from tests.fixtures_router import vllm_router

pytestmark = pytest.mark.anyio

TURNS = 5
BATCH = 12


def script(name: str, turns: int = TURNS) -> dict[str, Any]:
    work = repl(f"r = llm_query_batched([f'part {{i}}' for i in range({BATCH})])\nprint(len(r))")
    done = repl('answer["content"] = "done"\nanswer["ready"] = True')
    return {"root": [work] * (turns - 1) + [done], "sub_default": "fine", "server_header": name}


@asynccontextmanager
async def backends(turns: int = TURNS) -> AsyncIterator[list[ScriptedLM]]:
    servers = [ScriptedLM(script(f"b{i}", turns)).start() for i in range(3)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


async def run(settings: Settings, lm: LMClient, run_id: str, tmp_path: Path, sandboxes: Any = None) -> RunResult:
    events: list[RunEvent] = []

    async def sink(event: RunEvent) -> None:
        events.append(event)

    engine = RLMEngine(settings.engine, lm, sandboxes or FakeSandboxFactory(), system_prompt=RLM_MCP_SYSTEM_PROMPT)
    limits = make_limits(settings, max_iterations=TURNS + 2)
    result = await engine.run(
        run_id=run_id,
        query="Count the parts.",
        contexts=[make_context(tmp_path, name=run_id)],
        limits=limits,
        progress=RunProgress(run_id=run_id, max_iterations=limits.max_iterations),
        emit=sink,
    )
    failed = [e for e in events if isinstance(e, LLMCall) and e.status != "ok"]
    assert not failed, failed
    return result


def served(servers: Sequence[ScriptedLM], role: str, session: str | None = None) -> Counter[str]:
    """Backend name -> requests of `role` (and of that session) it answered."""
    return Counter(
        s.script.server_header or "?"
        for s in servers
        for r in s.requests_by_role(role)
        if r["status"] == 200 and (session is None or r["session"] == session)
    )


def settings_for(url: str, **extra: Any) -> Settings:
    return make_settings(base_url=url, model="rlm-v0.1", request_timeout_s=30.0, max_concurrent_lm_calls=8, **extra)


async def test_root_turns_stay_on_one_backend_and_sub_calls_spread(tmp_path: Path) -> None:
    async with backends() as servers:
        async with vllm_router([s.root_url for s in servers], log=tmp_path / "router.log") as url:
            settings = settings_for(url, lm_retries=1)
            async with LMClient(settings.lm, backoff_base_s=0.05) as lm:
                for run_id in ("run-a", "run-b"):
                    result = await run(settings, lm, run_id, tmp_path)
                    assert result.status == "completed", result.reason
        for run_id in ("run-a", "run-b"):
            roots = served(servers, "root", run_id)
            assert sum(roots.values()) == TURNS and len(roots) == 1, roots  # one replica holds the run
        subs = served(servers, "sub")
        assert sum(subs.values()) == 2 * (TURNS - 1) * BATCH
        assert set(subs) == {"b0", "b1", "b2"}, subs  # spread over all three
        seen = [r for s in servers for r in s.requests]
        for record in seen:
            headers = record["headers"]
            if record["role"] == "root":
                assert headers["x-session-id"] == record["session"] in ("run-a", "run-b")
            else:
                assert not {h.lower() for h in AFFINITY_HEADERS} & set(headers), headers
            assert "user" not in record["body"]
        request_ids = [r["headers"]["x-request-id"] for r in seen]
        assert len(set(request_ids)) == len(request_ids)  # unique per request


class GatedSandboxes(FakeSandboxFactory):
    """Pauses before the run's second cell until the test lets it go on."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = anyio.Event()
        self.resume = anyio.Event()
        self.cells = 0

    def __call__(self, contexts: Sequence[ContextSpec], *, levels_below: int = 0, kept: bool = False) -> Any:
        inner = super().__call__(contexts, levels_below=levels_below, kept=kept)
        gate = self

        @asynccontextmanager
        async def opened() -> AsyncIterator[Any]:
            async with inner as box:
                execute = box.execute

                async def gated(code: str, bridge: LMBridge, *, training_cell: bool = False) -> Any:
                    gate.cells += 1
                    if gate.cells == 2:
                        gate.paused.set()
                        await gate.resume.wait()
                    return await execute(code, bridge, training_cell=training_cell)

                box.execute = gated
                yield box

        return opened()


async def test_a_backend_killed_mid_run_costs_retries_not_the_run(tmp_path: Path) -> None:
    async with backends() as servers:
        by_name = {s.script.server_header: s for s in servers}
        # The router notices a dead worker within about a second; rlm-mcp retries for longer
        # (backoff 0.25 s doubling, 8 retries: about a minute at most).
        router_flags = [
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
            "--cb-failure-threshold",
            "1",
            "--cb-timeout-duration-secs",
            "60",
        ]
        async with vllm_router([s.root_url for s in servers], *router_flags, log=tmp_path / "router.log") as url:
            settings = settings_for(url, lm_retries=8)
            sandboxes = GatedSandboxes()
            results: list[RunResult] = []
            async with LMClient(settings.lm, backoff_base_s=0.25) as lm, anyio.create_task_group() as tg:

                async def go() -> None:
                    results.append(await run(settings, lm, "run-k", tmp_path, sandboxes))

                tg.start_soon(go)
                with anyio.fail_after(60):
                    await sandboxes.paused.wait()
                before = served(servers, "root", "run-k")
                assert len(before) == 1 and sum(before.values()) == 2, before
                victim = by_name[next(iter(before))]
                victim.stop()  # killed: connections closed, port refused from now on
                sandboxes.resume.set()
            (result,) = results
        assert result.status == "completed", result.reason
        after = served(servers, "root", "run-k") - before
        assert sum(after.values()) == TURNS - 2 and len(after) == 1, after  # moved once, to one replica
        assert victim.script.server_header not in after
        # Usage: exactly what the backends answered with 200, each call once.
        answered = [r for s in servers for r in s.requests if r["status"] == 200]
        total = result.usage.to_dict()["total"]
        assert total["calls"] == len(answered)
        assert total["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in answered)
        assert total["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in answered)
