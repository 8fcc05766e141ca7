"""End to end: the `rlm-mcp` console script over stdio, a real Docker sandbox, a scripted
OpenAI-compatible LM on loopback, the real `mcp` client."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import minimal_env, sandbox_container_ids, stdio_client, write_haystack

pytestmark = pytest.mark.anyio

NEEDLE = "ZEBRA-4471"

LOOK = """Let me look at the context first.
```repl
print(type(context).__name__, len(context))
print(context[:120])
```"""

SEARCH = """Now I search every chunk in parallel.
```repl
size = 40_000
chunks = [context[i:i + size] for i in range(0, len(context), size)]
replies = llm_query_batched(["Find the secret code in this text; reply NONE if absent.\\n" + c for c in chunks])
found = [r for r in replies if r != "NONE"]
print(len(chunks), "chunks; found:", found)
answer["content"] = found[0] if found else "not found"
answer["ready"] = True
```"""

SCRIPT = Script(
    root=[LOOK, SEARCH],
    sub=[{"match": r"secret code is (\S+?)\. ", "reply": r"\1"}],
    sub_default="NONE",
)


async def test_rlm_complete_finds_the_hidden_fact(tmp_path: Path) -> None:
    haystack = tmp_path / "haystack.txt"
    size = write_haystack(haystack, lines=60_000, needle_line=41_234, needle=NEEDLE)
    assert size > 3_000_000
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with ScriptedLM(SCRIPT) as lm:
        env = minimal_env(lm.base_url, tmp_path / "data", [tmp_path])
        owner = env["RLM_MCP_INSTANCE_ID"]
        async with stdio_client(env) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert {"rlm_load_context", "rlm_list_contexts", "rlm_complete"} <= tools

            loaded = await client.call_tool("rlm_load_context", {"path": str(haystack)})
            assert not loaded.is_error, loaded.content
            handle = loaded.structured_content
            assert handle["bytes"] == size
            assert handle["context_id"].startswith("ctx_")

            again = await client.call_tool("rlm_load_context", {"path": str(haystack), "name": "again"})
            assert again.structured_content["context_id"] == handle["context_id"]

            result = await client.call_tool(
                "rlm_complete",
                {"query": "What is the secret code?", "context_id": handle["context_id"]},
                progress_callback=on_progress,
            )
            assert not result.is_error, result.content
            out = result.structured_content
            assert out["status"] == "completed", out
            assert out["answer"] == NEEDLE
            assert out["iterations"] == 2
            assert out["run_id"].startswith("run_")
            assert out["sub_calls"] == len(range(0, size, 40_000))
            assert out["usage"]["total"]["calls"] == 2 + out["sub_calls"]

        root_requests = lm.requests_by_role("root")
        sub_requests = lm.requests_by_role("sub")

    # The root model saw metadata and REPL output only, never the context body.
    assert len(root_requests) == 2
    for request in root_requests:
        text = "".join(str(m.get("content")) for m in request["body"]["messages"])
        assert "filler line 0001000" not in text
        assert len(text) < 60_000
    metadata = root_requests[0]["body"]["messages"][1]["content"]
    assert "What is the secret code?" in metadata
    assert str(size) in metadata.replace(",", "")  # an ASCII text: chars == bytes
    # The sub-calls carried the context, all of it.
    assert sum(len(r["body"]["messages"][0]["content"]) for r in sub_requests) > size

    # Progress arrived on every turn, with readable messages.
    messages = [m for _, _, m in seen if m]
    assert any("turn 1/20" in m for m in messages), messages
    assert any("turn 2/20" in m for m in messages), messages

    # Nothing left behind once the server exited.
    assert not sandbox_container_ids(owner)
