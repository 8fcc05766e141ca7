"""The tools through two agent frameworks' own MCP client adapters, without any LLM of theirs:
the OpenAI Agents SDK (`agents.mcp.MCPServerStdio` -> FunctionTool.on_invoke_tool) and PydanticAI
(`MCPToolset` -> get_tools / call_tool), each against a real `rlm-mcp` over stdio, a real Docker
sandbox and the scripted LM. Both with the timeouts the README gives (their defaults, 5 s for the
Agents SDK, are too short for rlm_complete)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import SERVER_SCRIPT, minimal_env, sandbox_container_ids

pytestmark = pytest.mark.anyio

TEXT = "alpha\nbeta\nthe vault code is 7-7-3\ngamma\n"
SCRIPT = Script(
    model="qwen3:8b",
    base_model="qwen3:8b",  # not the adapter: no reference texts needed
    root=[
        "```repl\nline = [l for l in context.splitlines() if 'vault' in l][0]\n"
        "answer['content'] = llm_query('Extract the code: ' + line)\nanswer['ready'] = True\n```"
    ],
    sub=[{"match": r"code is (\S+)", "reply": r"\1"}],
)


def server_env(lm: ScriptedLM, tmp_path: Path) -> dict[str, str]:
    return minimal_env(lm.base_url, tmp_path / "data", [tmp_path], RLM_MCP_MODEL="qwen3:8b")


def no_containers_left(owner: str, deadline_s: float = 60.0) -> bool:
    """True once the server's sandboxes are gone (it removes them as it exits)."""
    end = time.monotonic() + deadline_s
    while sandbox_container_ids(owner):
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def check_run(result: dict[str, Any]) -> None:
    assert result["status"] == "completed", result
    assert result["answer"] == "7-7-3"


async def test_openai_agents_sdk_tools(tmp_path: Path) -> None:
    from agents import Agent, RunContextWrapper
    from agents.mcp import MCPServerStdio, MCPServerStdioParams
    from agents.tool import FunctionTool
    from agents.tool_context import ToolContext

    async def invoke(tool: FunctionTool, args: dict[str, Any]) -> dict[str, Any]:
        raw = json.dumps(args)
        out = await tool.on_invoke_tool(
            ToolContext(context=None, tool_name=tool.name, tool_call_id=f"call-{tool.name}", tool_arguments=raw), raw
        )
        # The adapter hands the model the tool's one text block: our tools' JSON result.
        assert isinstance(out, dict) and out["type"] == "text", out
        data: dict[str, Any] = json.loads(out["text"])
        return data

    with ScriptedLM(SCRIPT) as lm:
        env = server_env(lm, tmp_path)
        params: MCPServerStdioParams = {"command": str(SERVER_SCRIPT), "args": [], "env": env}
        async with MCPServerStdio(params=params, client_session_timeout_seconds=900, name="rlm") as server:
            agent = Agent(name="caller", mcp_servers=[server])
            tools = {t.name: t for t in await agent.get_mcp_tools(RunContextWrapper(context=None))}
            assert {"rlm_load_context", "rlm_complete"} <= tools.keys()
            loaded = await invoke(tools["rlm_load_context"], {"text": TEXT})  # type: ignore[arg-type]
            result = await invoke(
                tools["rlm_complete"],  # type: ignore[arg-type]
                {"query": "What is the vault code?", "context_id": loaded["context_id"]},
            )
            check_run(result)
        assert no_containers_left(env["RLM_MCP_INSTANCE_ID"])


async def test_pydantic_ai_toolset_tools(tmp_path: Path) -> None:
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai import RunContext
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    with ScriptedLM(SCRIPT) as lm:
        env = server_env(lm, tmp_path)
        # keep_alive=False: FastMCP otherwise keeps the server process (and its sandboxes) running
        # after the toolset closes, for a later connection.
        transport = StdioTransport(command=str(SERVER_SCRIPT), args=[], env=env, keep_alive=False)
        toolset: MCPToolset[None] = MCPToolset(
            transport, init_timeout=60, read_timeout=900, tool_error_behavior="error"
        )
        # A RunContext as an agent run would pass; TestModel is never asked anything.
        ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
        async with toolset:
            tools = await toolset.get_tools(ctx)
            assert {"rlm_load_context", "rlm_complete"} <= tools.keys()
            loaded = await toolset.call_tool("rlm_load_context", {"text": TEXT}, ctx, tools["rlm_load_context"])
            result = await toolset.call_tool(
                "rlm_complete",
                {"query": "What is the vault code?", "context_id": loaded["context_id"]},
                ctx,
                tools["rlm_complete"],
            )
            check_run(result)
        assert no_containers_left(env["RLM_MCP_INSTANCE_ID"])
