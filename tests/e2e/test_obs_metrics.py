"""Metrics (rlm_mcp/observability): a real server's /metrics, scraped by Debian's Prometheus and
queried through its HTTP API after runs; `promtool check metrics` on the exposition; the token
rule of the route; LM calls, retries and errors counted by the LM client against the scripted LM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client import REGISTRY

from rlm_mcp.lm.client import LMClient
from rlm_mcp.observability.exposition import metrics_endpoint, with_metrics
from rlm_mcp.ports.chat import LMServerError
from rlm_mcp.testing.script import Fault, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.fixtures_lm import lm_settings, sub_messages
from tests.fixtures_prometheus import Prometheus, prometheus_server, promtool
from tests.paths import REPO

pytestmark = pytest.mark.anyio

TOKEN = "metrics-test-token"
DASHBOARD = REPO / "deploy" / "grafana" / "rlm-mcp-dashboard.json"
# Panels an embedded server's two runs fill (the team queue's need team mode; retries and errors
# need failures).
WITH_DATA = {"Runs executing", "Tokens /s by model and kind", "Sandboxes by state", "Context store"}
PRICES = {"rlm-v0.1": {"input": 2.0, "cached_input": 0.5, "output": 10.0}}
TURNS = [
    "```repl\nfound = llm_query('is 42 the number? ' + context[:20])\nprint(found)\n```",
    '```repl\nanswer["content"] = "42"\nanswer["ready"] = True\n```',
]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _scrape(address: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"http://{address}/metrics", headers=headers, timeout=30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, ScriptedLM]]:
    with ScriptedLM(Script(root=TURNS, sub_default="yes")) as lm:
        port = free_port()
        env = cli_env(
            tmp_path,
            RLM_MCP_BASE_URL=lm.base_url,
            RLM_MCP_AUTH_TOKEN=TOKEN,
            RLM_MCP_MODEL_PRICES=json.dumps(PRICES),
            RLM_MCP_SANDBOX_MEMORY="256m",
        )
        argv = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
        with server_process(argv, port=port, env=env, within_s=120):
            yield f"127.0.0.1:{port}", lm


async def _two_runs(address: str) -> list[dict[str, object]]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=180)
    results = []
    async with http, Client(streamable_http_client(f"http://{address}/mcp", http_client=http)) as client:
        loaded = await client.call_tool("rlm_load_context", {"text": "The magic number is 42."})
        context_id = loaded.structured_content["context_id"]
        for _ in range(2):
            done = await client.call_tool("rlm_complete", {"query": "the number?", "context_id": context_id})
            assert done.structured_content is not None
            results.append(done.structured_content)
    return results


@pytest.mark.docker
async def test_prometheus_scrapes_a_server_whose_counters_follow_two_runs(
    served: tuple[str, ScriptedLM], tmp_path: Path
) -> None:
    address, lm = served
    assert _scrape(address, None).status_code == 401  # a token is set: the scrape needs it
    results = await _two_runs(address)
    assert [r["status"] for r in results] == ["completed", "completed"]

    exposition = _scrape(address, TOKEN)
    assert exposition.status_code == 200
    checked = promtool("check", "metrics", stdin=exposition.text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "run_" not in "".join(line for line in exposition.text.splitlines() if 'run_id="' in line)

    with prometheus_server(tmp_path / "prom", [address], token=TOKEN) as prom:
        await wait_until(prom.targets_up, within_s=60, what="Prometheus to scrape the server")
        await wait_until(
            lambda: prom.value('rlm_mcp_runs_finished_total{status="completed"}') == 2.0,
            within_s=60,
            what="two completed runs in Prometheus",
        )
        assert prom.value("rlm_mcp_runs_started_total") == 2.0
        assert prom.value("rlm_mcp_runs_running") == 0.0
        assert prom.value("rlm_mcp_run_duration_seconds_count") == 2.0
        assert prom.value("rlm_mcp_turns_total") == 4.0
        assert prom.value("rlm_mcp_sub_calls_total") == 2.0
        root_calls = prom.value('sum(rlm_mcp_lm_calls_total{endpoint="root",role="root",outcome="ok"})')
        sub_calls = prom.value('sum(rlm_mcp_lm_calls_total{role="sub",outcome="ok"})')
        assert (root_calls, sub_calls) == (4.0, 2.0)
        assert prom.value('sum(rlm_mcp_lm_call_duration_seconds_count{model="rlm-v0.1"})') == 6.0
        # every token the scripted LM reported, by role, and the cost the price table gives them
        requests = lm.requests
        prompt = sum(r["usage"]["prompt_tokens"] for r in requests)
        completion = sum(r["usage"]["completion_tokens"] for r in requests)
        assert prom.value('sum(rlm_mcp_lm_tokens_total{kind="prompt"})') == prompt
        assert prom.value('sum(rlm_mcp_lm_tokens_total{kind="completion"})') == completion
        cost = prom.value("sum(rlm_mcp_lm_cost_usd_total)")
        assert cost == pytest.approx((prompt * 2.0 + completion * 10.0) / 1e6)
        run_costs = [r["usage"]["total"]["cost_usd"] for r in results]  # type: ignore[index]
        assert sum(run_costs) == pytest.approx(cost)
        assert prom.value("rlm_mcp_sandbox_start_duration_seconds_count") >= 2.0  # type: ignore[operator]
        assert prom.value("rlm_mcp_sandbox_start_failures_total") == 0.0
        assert prom.value("rlm_mcp_cell_duration_seconds_count") == 4.0
        assert prom.value("rlm_mcp_cell_timeouts_total") == 0.0
        assert prom.value('rlm_mcp_sandboxes{state="running"}') == 0.0
        assert prom.value("rlm_mcp_context_store_bytes") == len("The magic number is 42.")
        assert prom.value("process_resident_memory_bytes") is not None  # the library's process collector
        # rates need two scrapes within their range
        await wait_until(lambda: (prom.value("count_over_time(up[1m])") or 0) >= 3, within_s=60, what="3 scrapes")
        _every_dashboard_query_evaluates(prom)


def _every_dashboard_query_evaluates(prom: Prometheus) -> None:
    """Grafana cannot run here: each panel's query goes to the same Prometheus instead (with
    Grafana's $__rate_interval as a fixed range); those of an embedded server's panels have data."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in (p for p in dashboard["panels"] if p["type"] != "row"):
        for target in panel["targets"]:
            result = prom.query(target["expr"].replace("$__rate_interval", "1m"))
            if panel["title"] in WITH_DATA:
                assert result, f"{panel['title']}: {target['expr']} has no data"


async def test_the_route_needs_the_token_unless_public() -> None:
    async def app(scope: object, receive: object, send: object) -> None:  # what the guard would answer
        await send({"type": "http.response.start", "status": 418, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    def client(public: bool) -> httpx.AsyncClient:
        routed = with_metrics(app, metrics_endpoint([TOKEN], public=public))
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=routed), base_url="http://10.0.0.9:8765")

    async with client(public=False) as guarded:
        refused = await guarded.get("/metrics")
        assert refused.status_code == 401 and "RLM_MCP_METRICS_PUBLIC" in refused.text
        assert (await guarded.get("/metrics", headers={"authorization": "Bearer wrong"})).status_code == 401
        ok = await guarded.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain; version=")
        assert "rlm_mcp_runs_started_total" in ok.text
        assert (await guarded.post("/metrics")).status_code == 405
        assert (await guarded.get("/mcp")).status_code == 418  # other paths go on to the guarded app
    async with client(public=True) as open_route:
        assert (await open_route.get("/metrics")).status_code == 200
    no_tokens = with_metrics(app, metrics_endpoint([], public=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=no_tokens), base_url="http://127.0.0.1") as local:
        assert (await local.get("/metrics")).status_code == 200  # no token configured: nothing to send


async def test_lm_calls_retries_and_errors_are_counted_by_endpoint_and_kind() -> None:
    script = Script(
        sub_default="fine",
        faults=[
            Fault(when="sub", status=503, times=1, match="hello"),  # one retry, then an answer
            Fault(when="sub", status=503, times=0, match="doomed"),  # every attempt fails
        ],
    )
    with ScriptedLM(script) as lm:
        settings = lm_settings(lm, lm_retries=1, model_prices={"rlm-v0.1": {"input": 1.0, "output": 1.0}})
        before_ok = _sample("rlm_mcp_lm_calls_total", endpoint="root", model="rlm-v0.1", role="sub", outcome="ok")
        before_retry = _sample("rlm_mcp_lm_retries_total", endpoint="root", kind="server")
        before_err = _sample("rlm_mcp_lm_errors_total", endpoint="root", kind="server")
        async with LMClient(settings.lm, backoff_base_s=0.01) as client:
            done = await client.complete(sub_messages("hello"), model="rlm-v0.1", max_tokens=64, role="sub")
            assert done.record.cost_usd == pytest.approx(
                (done.record.prompt_tokens + done.record.completion_tokens) / 1e6
            )
            with pytest.raises(LMServerError):
                await client.complete(sub_messages("doomed"), model="rlm-v0.1", max_tokens=64, role="sub")
    assert (
        _sample("rlm_mcp_lm_calls_total", endpoint="root", model="rlm-v0.1", role="sub", outcome="ok") == before_ok + 1
    )
    assert _sample("rlm_mcp_lm_retries_total", endpoint="root", kind="server") == before_retry + 2
    assert _sample("rlm_mcp_lm_errors_total", endpoint="root", kind="server") == before_err + 1
    failed = _sample("rlm_mcp_lm_calls_total", endpoint="root", model="rlm-v0.1", role="sub", outcome="server")
    assert failed >= 1
