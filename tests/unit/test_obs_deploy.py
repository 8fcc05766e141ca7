"""deploy/prometheus: the alert rules pass `promtool check rules`, and their unit tests (series
that fire each alert, and healthy series that must not) pass `promtool test rules`. The Grafana
dashboard's queries are evaluated against a live Prometheus in tests/e2e/test_obs_metrics.py."""

from __future__ import annotations

import json

from tests.fixtures_prometheus import promtool
from tests.paths import REPO

DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rlm-mcp-alerts.yml"


def test_the_alert_rules_are_valid() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "4 rules found" in checked.stdout


def test_each_alert_fires_on_the_series_that_should_fire_it() -> None:
    tested = promtool("test", "rules", str(RULES.with_name("rlm-mcp-alerts.test.yml")))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    fired = RULES.with_name("rlm-mcp-alerts.test.yml").read_text()
    for alert in ("RlmMcpQueueStuck", "RlmMcpNoLiveWorker", "RlmMcpLMErrorRate", "RlmMcpSandboxStartFailures"):
        assert f"alertname: {alert}" in fired  # every rule has a test that expects it to fire


def test_the_dashboard_queries_only_rlm_mcp_metrics_through_its_datasource_variable() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "rlm-mcp-dashboard.json").read_text())
    targets = [t for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
    assert len(targets) >= 20
    assert all(t["datasource"]["uid"] == "${datasource}" and "rlm_mcp_" in t["expr"] for t in targets)
