"""Helpers for tests of the MCP surface through the SDK's client (in process or over HTTP): the
settings of a test server, a tool call that must succeed or fail, a resource's text, and the
scripted replies several tier folders share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import Client
from mcp.types import ReadResourceResult, TextResourceContents

from rlm_mcp.config import Settings
from rlm_mcp.testing.script import RootScript, Script
from tests.fixtures_e2e import new_instance_id
from tests.fixtures_engine import cell, submit

# A root reply that answers at once.
ANSWER_NOW = """```repl
answer["content"] = "forty-two"
answer["ready"] = True
```"""

# A root reply whose cell never ends (until the run is cancelled or times out).
STUCK = """```repl
import time
while True:
    time.sleep(0.2)
```"""

# A root reply that asks a child RLM (rlm_query) and answers with its reply.
PARENT = """```repl
reply = rlm_query("Summarise this: the launch code is OWL-9.")
print(reply)
answer["content"] = "child said: " + reply
answer["ready"] = True
```"""

ALL_TOOLS = {
    "rlm_load_context",
    "rlm_upload_context",
    "rlm_list_contexts",
    "rlm_delete_context",
    "rlm_complete",
    "rlm_start",
    "rlm_status",
    "rlm_result",
    "rlm_cancel",
}

# A kept session of two runs: the first builds `counts`, the follow-up reads it with
# `context_1` and `history` (tests/e2e/test_sessions_server.py, test_viewer_sessions.py).
SCRIPT = Script(
    root_by_query=[
        RootScript(
            match="FIRST-Q",
            replies=[
                cell("counts = {w: context.count(w) for w in set(context.split())}\nprint(len(counts))"),
                submit('"built"'),
            ],
        ),
        RootScript(
            match="SECOND-Q",
            replies=[
                cell("print(len(counts), context_1[:6], history[0]['role'])"),
                submit("f\"{counts['alpha']}|{context_1[:6]}|{len(history_0)}|{context is context_0}\""),
            ],
        ),
    ]
)


def make_settings(tmp_path: Path, base_url: str, **overrides: Any) -> Settings:
    """A test server's settings under `tmp_path` (its data dir and allowed root), one warm sandbox,
    its own instance id; `overrides` win."""
    values: dict[str, Any] = {
        "base_url": base_url,
        "data_dir": tmp_path / "data",
        "allowed_roots": [tmp_path / "root"],
        "pool_size": 1,
        "sandbox_memory": "512m",
        "cell_timeout_s": 30,
        "instance_id": new_instance_id(),
    }
    values.update(overrides)
    (tmp_path / "root").mkdir(exist_ok=True)
    return Settings(**values)


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call that must succeed: its structured content."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def call_error(client: Client, tool: str, **args: Any) -> str:
    """A tool call that must fail: its error text."""
    result = await client.call_tool(tool, args)
    assert result.is_error, result.structured_content
    return " ".join(getattr(c, "text", "") for c in result.content)


def resource_text(result: ReadResourceResult) -> str:
    """The text of a resource read (every rlm:// resource is one text part)."""
    part = result.contents[0]
    assert isinstance(part, TextResourceContents), part
    return part.text
