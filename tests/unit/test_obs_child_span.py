"""The span of a child RLM (`rlm_query` at max_depth 2), recorded in memory while the engine runs
against the real LM client and the scripted LM: it hangs under the parent run's span in the same
trace (through the parent's turn, cell and sub-call batch), carries its depth and run id, and the
child's own LM calls are spans under it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine, RunProgress
from rlm_mcp.lm.client import LMClient
from rlm_mcp.observability import tracing
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.script import Script
from tests.fixtures_engine import FakeSandboxFactory, make_context, make_limits, repl

pytestmark = pytest.mark.anyio


def _root(messages: list[dict[str, Any]], turn: int) -> str:
    """The parent asks one child; the child reads its context (the prompt) and answers."""
    if not str(messages[1]["content"]).startswith("Answer the"):  # a child's metadata names no query
        if turn == 1:
            return repl("print(context[:20])")
        return repl('answer["content"] = "child saw: " + context[:10]\nanswer["ready"] = True')
    if turn == 1:
        return repl("r = rlm_query('child task, please')\nprint(r)")
    return repl('answer["content"] = r\nanswer["ready"] = True')


def _ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[ReadableSpan]:
    chain: list[ReadableSpan] = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        chain.append(span)
    return chain


async def test_a_child_rlm_span_hangs_under_the_parent_run_with_its_lm_calls(
    recorded_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    async with ScriptedLM(Script(root_fn=_root)) as server:
        settings = Settings(base_url=server.base_url, model="rlm-v0.1", lm_retries=0, request_timeout_s=60.0)
        limits = make_limits(settings, max_depth=2)
        async with LMClient(settings.lm, backoff_base_s=0.01) as client:
            engine = RLMEngine(settings.engine, client, FakeSandboxFactory(), system_prompt="SYSTEM")
            # The run's span as the service opens it around engine.run.
            with tracing.run_span(None, {"rlm.run.id": "p", "rlm.run.depth": 0}):
                result = await engine.run(
                    run_id="p",
                    query="What is the magic number?",
                    contexts=[make_context(tmp_path)],
                    limits=limits,
                    progress=RunProgress(run_id="p", max_iterations=limits.max_iterations),
                    emit=_ignore,
                )
    assert result.status == "completed" and result.answer == "child saw: child task", result.reason
    spans = recorded_spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    (run,) = [s for s in spans if s.name == "rlm.run"]
    (child,) = [s for s in spans if s.name == "rlm.child"]
    attrs = dict(child.attributes or {})
    assert attrs["rlm.depth"] == 1 and attrs["rlm.run.id"] == "p.1"
    assert attrs["rlm.run.status"] == "completed"
    assert child.context.trace_id == run.context.trace_id
    # child -> the parent's sub-call batch -> its cell -> its turn -> the run
    assert [s.name for s in _ancestors(child, by_id)] == ["rlm.sub_calls", "rlm.cell", "rlm.turn", "rlm.run"]
    lm_calls = [s for s in spans if s.name.startswith("chat ")]
    under_child = [s for s in lm_calls if child in _ancestors(s, by_id)]
    # the child's two turns, each one root-role LM call, through the child's own turn spans
    assert len(under_child) == 2 and len(lm_calls) == 4
    assert all(dict(s.attributes or {})["rlm.lm.role"] == "root" for s in under_child)
    assert {dict(_ancestors(s, by_id)[0].attributes or {})["rlm.depth"] for s in under_child} == {1}
    parent_calls = [s for s in lm_calls if s not in under_child]
    assert all(_ancestors(s, by_id)[-1] is run for s in parent_calls)
    assert {dict(_ancestors(s, by_id)[0].attributes or {})["rlm.depth"] for s in parent_calls} == {0}


async def _ignore(event: object) -> None:
    return None
