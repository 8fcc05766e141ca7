"""Cost from the price table (RLM_MCP_MODEL_PRICES): per call, summed per model and run in the
usage shape every record and result carries, in eval reports; a model without a price has no
cost, never a guessed one."""

from __future__ import annotations

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.eval.report import render_markdown, summarize
from rlm_mcp.eval.results import TaskResult
from rlm_mcp.observability.prices import call_cost
from rlm_mcp.ports.chat import CallRecord
from rlm_mcp.usage import Usage

PRICES = '{"big": {"input": 3, "cached_input": 0.3, "output": 15}, "small": {"input": 0.1, "output": 0.4}}'


def test_a_call_costs_input_cached_input_and_output_at_their_prices() -> None:
    prices = Settings(model_prices=PRICES).lm.model_prices
    # 1000 prompt tokens of which 400 cached, 200 completion tokens
    assert call_cost(prices, "big", 1000, 200, 400) == pytest.approx((600 * 3 + 400 * 0.3 + 200 * 15) / 1e6)
    # no cached price: cached tokens cost the input price (no discount assumed)
    assert call_cost(prices, "small", 1000, 200, 400) == pytest.approx((1000 * 0.1 + 200 * 0.4) / 1e6)
    assert call_cost(prices, "unlisted", 1000, 200, 0) is None


def test_usage_sums_only_priced_calls_and_omits_cost_when_none_had_one() -> None:
    usage = Usage()
    usage.add_call(CallRecord("big", 1000, 100, 0.1, "ok", cost_usd=0.0045))
    usage.add_call(CallRecord("other", 500, 50, 0.1, "ok"))  # no price
    usage.add_call(CallRecord("big", 1000, 100, 0.1, "ok", cost_usd=0.0045))
    assert usage.total.cost_usd == pytest.approx(0.009)
    assert usage.by_model["big"].cost_usd == pytest.approx(0.009)
    assert usage.by_model["other"].cost_usd is None
    data = usage.to_dict()
    assert "cost_usd" not in data["by_model"]["other"]  # the JSON earlier versions wrote
    assert Usage.of(data).total.cost_usd == pytest.approx(0.009)  # read back from a record
    merged = Usage()
    merged.merge(usage)
    assert merged.total.cost_usd == pytest.approx(0.009)
    unpriced = Usage()
    unpriced.add_call(CallRecord("other", 5, 5, 0.1, "ok"))
    assert "cost_usd" not in unpriced.to_dict()["total"]


def test_eval_reports_show_the_cost_or_a_dash() -> None:
    priced = Usage()
    priced.add("big", 100, 10, cost_usd=0.25)
    results = [
        TaskResult(id="a", status="completed", answer="x", expected="x", scorer="exact", score=1.0, usage=priced),
        TaskResult(id="b", status="completed", answer="x", expected="x", scorer="exact", score=1.0, usage=priced),
    ]
    unpriced = [TaskResult(id="c", status="completed", answer="x", expected="x", scorer="exact", score=1.0)]
    text = render_markdown([summarize("rlm", results), summarize("direct", unpriced)], wall_s=1.0, title="t")
    assert "cost (USD)" in text
    assert "| 0.5000 |" in text
    assert "| – |" in text


def test_a_malformed_price_table_names_the_setting() -> None:
    with pytest.raises(ValueError) as caught:
        Settings(model_prices="{not json")
    assert "RLM_MCP_MODEL_PRICES" in str(caught.value)
    with pytest.raises(ValueError):
        Settings(model_prices='{"m": {"input": -1, "output": 1}}')
    with pytest.raises(ValueError):
        Settings(model_prices='{"m": {"input": 1, "output": 1, "typo": 2}}')
