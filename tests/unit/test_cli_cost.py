"""What a run cost, where a person reads runs (issue 41 item 9): `rlm-mcp run`'s summary line and
`rlm-mcp runs list` show the cost the price table (RLM_MCP_MODEL_PRICES) gives, and a dash (or
nothing) when no model it called has a price: no cost is ever guessed."""

from __future__ import annotations

from rlm_mcp.cli.run import runs_table, status_line
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.runs import RunLimits, RunRecord, RunRequest, RunResult
from rlm_mcp.usage import Usage

LIMITS = RunLimits(max_iterations=3, max_depth=1, timeout_s=60.0, token_budget=None, max_errors=2)


def record(run_id: str, usage: Usage) -> RunRecord:
    request = RunRequest(query="what?", context_ids=["ctx"], owner=LOCAL_OWNER, limits=LIMITS)
    result = RunResult(
        status="completed",
        answer="a",
        reason=None,
        run_id=run_id,
        iterations=1,
        usage=usage,
        duration_s=2.5,
        sub_calls=0,
    )
    return RunRecord(run_id=run_id, created_at=1_700_000_000.0, request=request, status="completed", result=result)


def priced() -> Usage:
    usage = Usage()
    usage.add("big", 1000, 200, cost_usd=0.0123)
    usage.add("unlisted", 10, 10)
    return usage


def unpriced() -> Usage:
    usage = Usage()
    usage.add("unlisted", 10, 10)
    return usage


def test_the_run_summary_shows_the_cost_when_priced() -> None:
    line = status_line(record("run_0123456789ab", priced()).result)
    assert " · 1,220 tokens · $0.0123 · 2.5 s · run run_0123456789ab" in line, line
    assert "$" not in status_line(record("run_ba9876543210", unpriced()).result)


def test_runs_list_has_a_cost_column() -> None:
    header, paid, free = runs_table([record("run_0123456789ab", priced()), record("run_ba9876543210", unpriced())])
    assert header.split() == ["RUN", "ID", "STARTED", "DURATION", "COST", "STATUS", "QUERY"]
    assert "$0.0123" in paid and paid.index("$0.0123") + len("$0.0123") == header.index("COST") + len("COST")
    assert free[header.index("COST") + len("COST") - 1] == "-", free
