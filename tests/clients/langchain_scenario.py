"""The protocol-era scenario through LangChain tool objects (`langchain-mcp-adapters`, with its
own `mcp` 1.x) in an environment of its own: `python langchain_scenario.py stdio '<command JSON>'
FOLDER` or `... http URL FOLDER`.
The tools are LangChain `BaseTool`s invoked directly (no LLM), as an agent would call them; the
resource is read as a LangChain `Blob`.
Prints one JSON object of what it saw. Imports nothing of rlm-mcp."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version
from typing import Any

from langchain_core.tools import BaseTool
from langchain_mcp_adapters.callbacks import CallbackContext, Callbacks
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.resources import load_mcp_resources
from langchain_mcp_adapters.tools import load_mcp_tools

_calls = 0


async def call(tools: dict[str, BaseTool], name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Invoke as an agent's tool call does, and return the MCP structured content (the artifact)."""
    global _calls
    _calls += 1
    message = await tools[name].ainvoke({"type": "tool_call", "id": f"call-{_calls}", "name": name, "args": args})
    if message.artifact is None:
        raise RuntimeError(f"{name} returned no structured content: {message.content!r}")
    return dict(message.artifact["structured_content"])


async def main(transport: str, target: str, folder: str) -> None:
    if transport == "stdio":
        spec = json.loads(target)
        connection: Any = {"transport": "stdio", "command": spec["command"], "args": spec["args"], "env": spec["env"]}
    else:
        connection = {"transport": "streamable_http", "url": target}
    client = MultiServerMCPClient({"rlm": connection})
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None, context: CallbackContext) -> None:
        progress.append(message or "")

    seen: dict[str, Any] = {"mcp": version("mcp"), "adapters": version("langchain-mcp-adapters")}
    async with client.session("rlm") as session:
        listed = await load_mcp_tools(session, callbacks=Callbacks(on_progress=on_progress))
        seen["is_base_tool"] = all(isinstance(tool, BaseTool) for tool in listed)
        tools = {tool.name: tool for tool in listed}
        context_id = (await call(tools, "rlm_load_context", {"path": folder}))["context_id"]
        seen["complete"] = await call(tools, "rlm_complete", {"query": "Q-ok", "context_id": context_id})
        seen["progress"] = len(progress)
        run_id = (await call(tools, "rlm_start", {"query": "Q-ok again", "context_id": context_id}))["run_id"]
        seen["status"] = (await call(tools, "rlm_status", {"run_id": run_id}))["status"]
        seen["result"] = await call(tools, "rlm_result", {"run_id": run_id, "wait_s": 60})
        slow_id = (await call(tools, "rlm_start", {"query": "Q-slow", "context_id": context_id}))["run_id"]
        await call(tools, "rlm_cancel", {"run_id": slow_id})
        seen["cancelled"] = await call(tools, "rlm_result", {"run_id": slow_id, "wait_s": 60})
        blobs = await load_mcp_resources(session, uris=[f"rlm://contexts/{context_id}"])
        seen["resource"] = json.loads(blobs[0].as_string())
    print(json.dumps(seen, default=str))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
