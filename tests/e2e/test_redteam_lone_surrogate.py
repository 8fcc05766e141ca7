"""Red team, round five (issue 41, finding 3): a lone UTF-16 surrogate in an answer, here half an
emoji copied from a JSON context, made the run unrecordable (embedded: the record was lost and
the caller got "Error executing tool rlm_complete"). The host's frame parser makes every string
from the sandbox valid text, so the run completes and its record reads back."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import minimal_env, stdio_client

pytestmark = pytest.mark.anyio

COPY = """```repl
answer["content"] = context["title"] + " / " + "\\ud800"
answer["ready"] = True
```"""


async def test_an_answer_holding_a_lone_surrogate_is_answered_and_recorded(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=[COPY])) as lm:
        async with stdio_client(minimal_env(lm.base_url, tmp_path / "data", [tmp_path])) as client:
            # JSON text whose escape is half an emoji: json.loads in the sandbox makes a lone surrogate.
            text = '{"title": "half \\ud83d an emoji"}'
            loaded = await client.call_tool("rlm_load_context", {"text": text, "format": "json"})
            assert not loaded.is_error, loaded.content
            done = await client.call_tool(
                "rlm_complete", {"query": "copy the title", "context_id": loaded.structured_content["context_id"]}
            )
            assert not done.is_error, done.content
            assert done.structured_content["status"] == "completed"
            assert done.structured_content["answer"] == "half \ufffd an emoji / \ufffd"
            run_id = done.structured_content["run_id"]
            again = await client.call_tool("rlm_result", {"run_id": run_id})
    assert not again.is_error, again.content
    assert again.structured_content["status"] == "completed"
    assert again.structured_content["answer"] == "half \ufffd an emoji / \ufffd"
