"""A bad value inside a JSON setting is one line naming its key (issue 41 item 9): a price table
with one wrong number says which model and which price, not the whole setting."""

from __future__ import annotations

import pytest

from rlm_mcp.cli import main


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('{"gpt-4.1": {"input": -1, "output": 15}}', 'RLM_MCP_MODEL_PRICES["gpt-4.1"]["input"]=-1: '),
        ('{"m": {"input": 3, "output": 15, "ouput": 2}}', 'RLM_MCP_MODEL_PRICES["m"]["ouput"]=2: '),
        ('{"m": 3}', 'RLM_MCP_MODEL_PRICES["m"]=3: '),
    ],
)
def test_a_bad_price_names_its_model_and_key_in_one_line(
    table: str, named: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RLM_MCP_MODEL_PRICES", table)
    assert main(["runs", "list"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err
