"""Sub-call policy through the whole stack (MCP server, real Docker sandbox, engine bridge):
which model a sub-call reaches, how many calls a run makes, how big a batch may be."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import minimal_env, stdio_client

pytestmark = pytest.mark.anyio

CODE = """
print(llm_query("m1", model="extra-model"))
print(llm_query("m2", model="not-listed"))
print(llm_query("m3", model="rlm-v0.1"))
try:
    llm_query_batched(["b"] * 3)
except Exception as exc:
    print("batch refused:", type(exc).__name__, exc)
print(llm_query_batched(["c1", "c2"]))
"""


async def test_model_policy_and_caps_through_docker(tmp_path: Path) -> None:
    script = {
        "extra_models": ["extra-model", "not-listed"],
        "root": [f"```repl\n{CODE.strip()}\n```", '```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```'],
        "sub_default": "sub:{prompt}",
    }
    with ScriptedLM(script) as lm:
        env = minimal_env(
            lm.base_url,
            tmp_path / "data",
            [tmp_path],
            RLM_MCP_ALLOWED_SUB_MODELS="extra-model",
            RLM_MCP_MAX_SUB_CALLS_PER_RUN="4",
            RLM_MCP_MAX_PROMPTS_PER_BATCH="2",
        )
        async with stdio_client(env) as client:
            loaded = await client.call_tool("rlm_load_context", {"text": "some context"})
            result = await client.call_tool(
                "rlm_complete", {"query": "q", "context_id": loaded.structured_content["context_id"]}
            )
            assert not result.is_error, result.content
            assert result.structured_content["status"] == "completed"
        subs = lm.requests_by_role("sub")
        output = lm.requests_by_role("root")[1]["body"]["messages"][4]["content"]
    # A listed model is used; an unlisted one falls back to the sub model (the root model here).
    assert [(r["model"], r["body"]["messages"][0]["content"]) for r in subs] == [
        ("extra-model", "m1"),
        ("rlm-v0.1", "m2"),
        ("rlm-v0.1", "m3"),
        ("rlm-v0.1", "c1"),
    ]
    assert "sub:m1\nsub:m2\nsub:m3\n" in output
    # The batch cap (2) refuses a 3-prompt batch inside the sandbox before any call.
    assert "batch refused: ValueError" in output and "at most 2 prompts" in output
    # The call cap (4) of the run tree: the 5th prompt gets an error string.
    assert "['sub:c1', \"Error: the run's limit of 4 sub-calls is reached" in output
