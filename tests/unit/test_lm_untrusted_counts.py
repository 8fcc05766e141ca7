"""Numbers from the operator's price table and from the LM endpoint are checked where they enter
(issue 41, lows): an infinite, NaN or negative price is refused when the settings load, in one line
naming RLM_MCP_MODEL_PRICES (an infinite one made the viewer's run API answer 500 and the cost
counter NaN); a negative or 400-digit token count in a reply is not a count (it ended the run
"internal error"): the call's counts are estimated, as for a reply without usage; and a reply's
text is valid text (half a character becomes U+FFFD)."""

from __future__ import annotations

from pathlib import Path

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from rlm_mcp.config import load_settings
from rlm_mcp.config_check import SettingsError
from rlm_mcp.engine import RLMEngine, RunProgress
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.http import HttpReply
from rlm_mcp.lm.responses import parse_completion
from rlm_mcp.lm.tokens import MAX_REPORTED_TOKENS
from rlm_mcp.testing.script import Fault, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_engine import Events, FakeSandboxFactory, make_context, make_limits, repl
from tests.fixtures_lm import lm_settings

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("price", ["Infinity", "1e999", "NaN", "-Infinity", "-1"])
def test_a_price_that_is_not_a_finite_amount_is_refused_naming_the_setting(price: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(model_prices=f'{{"m": {{"input": 1, "cached_input": 0.5, "output": {price}}}}}')
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith('RLM_MCP_MODEL_PRICES["m"]["output"]=')  # the key named


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": -2}},
        {"prompt_tokens": 10**400, "completion_tokens": 10**400, "prompt_tokens_details": {"cached_tokens": 10**400}},
        {"prompt_tokens": True, "completion_tokens": 2.5},
    ],
    ids=["negative", "400_digits", "not_integers"],
)
async def test_token_counts_that_are_not_counts_are_estimated_and_the_run_goes_on(
    tmp_path: Path, usage: dict[str, object]
) -> None:
    turns = [repl("x = len(context)\nprint(x)"), repl('answer["content"] = str(x)\nanswer["ready"] = True')]
    script = Script(root=turns, faults=[Fault(when="root", usage=usage, times=0)])
    with ScriptedLM(script) as server:
        settings = lm_settings(server, lm_retries=0, model_prices='{"rlm-v0.1": {"input": 1, "output": 2}}')
        limits = make_limits(settings)
        async with LMClient(settings.lm, backoff_base_s=0.01) as client:
            engine = RLMEngine(settings.engine, client, FakeSandboxFactory(), system_prompt="SYSTEM")
            progress = RunProgress(run_id="r", max_iterations=limits.max_iterations)
            result = await engine.run(
                run_id="r", query="How long is it?", contexts=[make_context(tmp_path)], limits=limits,
                progress=progress, emit=Events(),
            )  # fmt: skip
    assert result.status == "completed", result.reason
    total = result.usage.total
    assert total.calls == 2
    assert 0 < total.prompt_tokens <= 2 * MAX_REPORTED_TOKENS and 0 < total.completion_tokens <= 2 * MAX_REPORTED_TOKENS
    assert total.cached_prompt_tokens == 0
    assert total.cost_usd is not None and 0 < total.cost_usd < 1


def test_a_reply_holding_half_a_character_is_read_as_valid_text() -> None:
    """An endpoint may escape half a character (`\\ud83d`) in its JSON: the reply's text is kept
    and sent on (to the sandbox, into records), where a lone surrogate cannot be encoded."""
    body = (
        b'{"choices": [{"message": {"content": "FINAL(half \\ud83d, whole \\ud83d\\ude00)"}, "finish_reason": "stop"}]}'
    )
    reply = HttpReply("http://lm/v1/chat/completions", 200, CIMultiDictProxy(CIMultiDict()), body)
    completion = parse_completion(reply, [{"role": "user", "content": "q"}], "m", "root", 0.0, 0.0)
    assert completion.text == "FINAL(half \ufffd, whole \U0001f600)"
    completion.text.encode("utf-8")
