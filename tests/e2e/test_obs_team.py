"""Team mode at work: a front and a worker on PostgreSQL. The queue gauges move on the front's
/metrics (a run queued with no worker: depth 1, its age growing, no live worker; then a worker
takes it: depth 0, one live worker); Debian's Prometheus scrapes the front and the worker's
health listener (token required) and finds the run finished on the worker with its claim
latency; the run's trace goes from the front's MCP span, through the queue (the record's
trace_context), to the worker's run span, in Arize Phoenix."""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from mcp import Client
from mcp.types import RequestParamsMeta
from prometheus_client.parser import text_string_to_metric_families

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_phoenix import Phoenix
from tests.fixtures_prometheus import prometheus_server
from tests.fixtures_surface import ANSWER_NOW, call
from tests.fixtures_team import SHORT_LEASES, Replica, replica_client, team_replica

pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.postgres]

TOKEN = "obs-team-token"


def _replica(tmp_path: Path, name: str, db: str, lm_url: str, role: str, **env: str) -> Any:
    return team_replica(
        tmp_path / name, role=role, database_url=db, lm_url=lm_url, tokens=[TOKEN], env={**SHORT_LEASES, **env}
    )


def _samples(replica: Replica) -> dict[str, float]:
    """The replica's own /metrics, unlabelled samples by name (a scrape, not Prometheus)."""
    text = httpx.get(f"{replica.base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def _unauthorised(replica: Replica) -> bool:
    return httpx.get(f"{replica.base}/metrics", timeout=30).status_code == 401


async def test_queue_gauges_move_and_prometheus_sees_the_worker_finish_the_run(tmp_path: Path, pg_url: str) -> None:
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm, ExitStack() as stack:
        front = stack.enter_context(_replica(tmp_path, "front", pg_url, lm.base_url, "front"))
        async with replica_client(front, TOKEN) as on_front:
            cid = (await call(on_front, "rlm_load_context", text="queued haystack " * 50))["context_id"]
            run_id = (await call(on_front, "rlm_start", query="q", context_id=cid))["run_id"]

            def queued_and_aging() -> bool:
                seen = _samples(front)
                return (
                    seen.get("rlm_mcp_queue_depth") == 1
                    and seen.get("rlm_mcp_queue_oldest_age_seconds", 0) > 0
                    and seen.get("rlm_mcp_workers_alive") == 0
                )

            await wait_until(queued_and_aging, within_s=60, what="the front's gauges to show one queued run, no worker")
            worker = stack.enter_context(_replica(tmp_path, "worker", pg_url, lm.base_url, "worker"))
            result = await call(on_front, "rlm_result", run_id=run_id, wait_s=120)
            assert result["status"] == "completed", result

        def drained() -> bool:
            seen = _samples(front)
            return seen.get("rlm_mcp_queue_depth") == 0 and seen.get("rlm_mcp_workers_alive") == 1

        await wait_until(drained, within_s=60, what="the front's gauges to show the queue drained, one worker")
        assert _unauthorised(worker) and _unauthorised(front)  # tokens are set: scrapes need one
        targets = [front.base.removeprefix("http://"), worker.base.removeprefix("http://")]
        with prometheus_server(tmp_path / "prom", targets, token=TOKEN) as prom:
            await wait_until(
                lambda: prom.value("count(up == 1)") == 2.0, within_s=60, what="Prometheus to scrape both replicas"
            )
            on_worker = f'instance="{targets[1]}"'
            assert prom.value(f'rlm_mcp_runs_finished_total{{status="completed",{on_worker}}}') == 1.0
            assert prom.value(f"rlm_mcp_queue_claim_latency_seconds_count{{{on_worker}}}") == 1.0
            assert (prom.value(f"rlm_mcp_queue_claim_latency_seconds_sum{{{on_worker}}}") or 0) > 0
            assert prom.value(f'sum(rlm_mcp_lm_calls_total{{role="root",outcome="ok",{on_worker}}})') == 1.0
            # the front executes nothing; both report the same queue
            assert prom.value(f'rlm_mcp_runs_started_total{{instance="{targets[0]}"}}') == 0.0
            assert prom.value("max(rlm_mcp_workers_alive)") == 1.0
            assert prom.value("max(rlm_mcp_queue_depth)") == 0.0


async def test_a_runs_trace_goes_from_the_front_through_the_queue_to_the_worker(
    tmp_path: Path, pg_url: str, phoenix: Phoenix
) -> None:
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm, ExitStack() as stack:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.base, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        front = stack.enter_context(_replica(tmp_path, "front", pg_url, lm.base_url, "front", **otel))
        stack.enter_context(_replica(tmp_path, "worker", pg_url, lm.base_url, "worker", **otel))
        async with replica_client(front, TOKEN) as on_front:
            cid = (await call(on_front, "rlm_load_context", text="traced haystack " * 50))["context_id"]
            done = await _complete(on_front, cid, {"traceparent": f"00-{caller_trace}-{caller_span}-01"})
        assert done["status"] == "completed", done
        traceparents = [r["headers"].get("traceparent", "") for r in lm.requests]

        expected = {"tools/call rlm_complete", "rlm.run", "rlm.turn", "chat rlm-v0.1"}

        def traced() -> bool:
            # Each process exports its own spans on its own schedule: the front's may come after the worker's.
            names = {s["name"] for s in phoenix.spans() if s["context"]["trace_id"] == caller_trace}
            return expected <= names

        await wait_until(traced, within_s=60, what="Phoenix to hold the front's call span and the worker's spans")
        spans = [s for s in phoenix.spans() if s["context"]["trace_id"] == caller_trace]
        call_span = next(s for s in spans if s["name"] == "tools/call rlm_complete")
        run = next(s for s in spans if s["name"] == "rlm.run")
        assert call_span["parent_id"] == caller_span
        assert run["parent_id"] == call_span["context"]["span_id"]  # across processes, through the record
        assert run["attributes"]["rlm.run.id"] == done["run_id"]
        turn = next(s for s in spans if s["name"] == "rlm.turn")
        chat = next(s for s in spans if s["name"] == "chat rlm-v0.1")
        assert turn["parent_id"] == run["context"]["span_id"] and chat["parent_id"] == turn["context"]["span_id"]
        assert traceparents == [f"00-{caller_trace}-{chat['context']['span_id']}-01"]


async def _complete(client: Client, context_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(
        "rlm_complete", {"query": "q", "context_id": context_id}, meta=cast(RequestParamsMeta, meta)
    )
    assert not result.is_error and result.structured_content is not None, result.content
    return result.structured_content
