"""The protocol-era scenario, run by the Python `mcp` 1.x client (handshake era) in its own
environment: `python mcp1_scenario.py stdio '<command JSON>' FOLDER` or `... http URL FOLDER`.
Prints one JSON object of what it saw. Runs under mcp 1.x only; it imports nothing of rlm-mcp."""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import AsyncExitStack
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client


async def scenario(session: ClientSession, folder: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    init = await session.initialize()
    seen["protocol"] = init.protocolVersion
    loaded = await session.call_tool("rlm_load_context", {"path": folder})
    context_id = loaded.structuredContent["context_id"]
    seen["files"] = loaded.structuredContent.get("files")
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    done = await session.call_tool(
        "rlm_complete", {"query": "Q-ok", "context_id": context_id}, progress_callback=on_progress
    )
    seen["complete"] = done.structuredContent
    seen["progress"] = len(progress)
    started = await session.call_tool("rlm_start", {"query": "Q-ok again", "context_id": context_id})
    run_id = started.structuredContent["run_id"]
    seen["status"] = (await session.call_tool("rlm_status", {"run_id": run_id})).structuredContent["status"]
    result = await session.call_tool("rlm_result", {"run_id": run_id, "wait_s": 60})
    seen["result"] = result.structuredContent
    slow = await session.call_tool("rlm_start", {"query": "Q-slow", "context_id": context_id})
    slow_id = slow.structuredContent["run_id"]
    await session.call_tool("rlm_cancel", {"run_id": slow_id})
    seen["cancelled"] = (await session.call_tool("rlm_result", {"run_id": slow_id, "wait_s": 60})).structuredContent
    resource = await session.read_resource(f"rlm://contexts/{context_id}")
    seen["resource"] = json.loads(resource.contents[0].text)
    return seen


async def main(transport: str, target: str, folder: str) -> None:
    async with AsyncExitStack() as stack:
        if transport == "stdio":
            spec = json.loads(target)
            params = StdioServerParameters(command=spec["command"], args=spec["args"], env=spec["env"])
            read, write = await stack.enter_async_context(stdio_client(params))
        else:
            read, write, _ = await stack.enter_async_context(streamablehttp_client(target))
        session = await stack.enter_async_context(ClientSession(read, write))
        print(json.dumps(await scenario(session, folder), default=str))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
