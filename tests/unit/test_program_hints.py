"""Program hints (`RLM_MCP_PROGRAM_HINTS`) through the real `vllm-router 0.1.17
--enable-program-scheduling` over two scripted backends: the router accepts every root call's
`vllm_xargs.agentic_context` (a refused one would be a 400 and fail the run) and tracks the run and
its child RLM as programs, the child under its parent; sub-calls carry none; off by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from rlm_mcp.engine import RLMEngine, RunProgress
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.routing import program_hints
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_engine import FakeSandboxFactory, make_context, make_limits, repl
from tests.fixtures_router import vllm_router

pytestmark = pytest.mark.anyio

SCRIPT: dict[str, Any] = {
    "root": [
        repl("r = llm_query_batched(['a', 'b', 'c'])\nc = rlm_query('child task: say ok')\nprint(len(r), c)"),
        repl('answer["content"] = "done"\nanswer["ready"] = True'),
    ],
    "root_by_query": [{"match": "child task", "replies": [repl('answer["content"] = "ok"\nanswer["ready"] = True')]}],
    "sub_default": "fine",
}


async def run_once(url: str, tmp_path: Path, run_id: str, **settings: Any) -> str:
    s = make_settings(tmp_path, base_url=url, model="rlm-v0.1", max_depth=2, max_iterations=4, **settings)

    async def sink(event: Any) -> None:
        pass

    async with LMClient(s.lm, routing=s.routing) as lm:
        engine = RLMEngine(s.engine, lm, FakeSandboxFactory(), system_prompt=RLM_MCP_SYSTEM_PROMPT)
        limits = make_limits(s)
        result = await engine.run(
            run_id=run_id,
            query="Count the parts.",
            contexts=[make_context(tmp_path, name=run_id)],
            limits=limits,
            progress=RunProgress(run_id=run_id, max_iterations=limits.max_iterations),
            emit=sink,
        )
    assert result.status == "completed", result.reason
    return run_id


def test_the_hints_name_the_program_its_root_and_the_parent_it_blocks() -> None:
    assert program_hints("run_a") == {
        "agentic_context": {"program_id": "run_a", "root_program_id": "run_a", "expected_resume": True}
    }
    assert program_hints("run_a.2.1")["agentic_context"] == {
        "program_id": "run_a.2.1",
        "root_program_id": "run_a",
        "parent_program_id": "run_a.2",
        "blocks_parent": True,
        "expected_resume": True,
    }


async def test_the_router_accepts_and_tracks_the_programs(tmp_path: Path) -> None:
    servers = [ScriptedLM(SCRIPT).start() for _ in range(2)]
    try:
        async with vllm_router(
            [s.root_url for s in servers],
            "--enable-program-scheduling",
            log=tmp_path / "router.log",
            policy="sticky_least_loaded",
        ) as url:
            await run_once(url, tmp_path, "run_hinted", program_hints=True)
            await run_once(url, tmp_path, "run_plain")  # the default: no hints
            async with httpx.AsyncClient(timeout=10) as client:
                diagnostics = (await client.get(url.removesuffix("/v1") + "/scheduling/diagnostics")).json()
        assert diagnostics["enabled"] is True
        programs = {p["task_id"]: p for rank in diagnostics["ranks"] for p in rank["programs"]}
        assert programs["run_hinted"]["root_program_id"] == "run_hinted"
        child = programs["run_hinted.1"]
        assert (child["parent_program_id"], child["root_program_id"], child["blocks_parent"]) == (
            "run_hinted",
            "run_hinted",
            True,
        )
        assert not {t for t in programs if t.startswith("run_plain")}  # no hints, no programs
        seen = [r for s in servers for r in s.requests]
        for record in seen:
            hinted = record["body"].get("vllm_xargs")
            if record["role"] == "root" and record["session"].startswith("run_hinted"):
                assert hinted == program_hints(record["session"])  # passed on to the backend as sent
            else:
                assert hinted is None, record
    finally:
        for server in servers:
            server.stop()
