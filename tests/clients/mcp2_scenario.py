"""The protocol-era scenario, run by the Python `mcp` 2.x `Client` (protocol 2026-07-28, the
project's own SDK): `python mcp2_scenario.py stdio '<command JSON>' FOLDER` or `... http URL
FOLDER`. The same steps, and the same JSON printed, as mcp1_scenario.py (the handshake era);
it imports nothing of rlm-mcp."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


async def call(client: Client, tool: str, args: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args, **kwargs)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{tool} failed: {result.content}")
    return result.structured_content


async def scenario(client: Client, folder: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"protocol": client.protocol_version}
    loaded = await call(client, "rlm_load_context", {"path": folder})
    context_id = loaded["context_id"]
    seen["files"] = loaded.get("files")
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    seen["complete"] = await call(
        client, "rlm_complete", {"query": "Q-ok", "context_id": context_id}, progress_callback=on_progress
    )
    seen["progress"] = len(progress)
    run_id = (await call(client, "rlm_start", {"query": "Q-ok again", "context_id": context_id}))["run_id"]
    seen["status"] = (await call(client, "rlm_status", {"run_id": run_id}))["status"]
    seen["result"] = await call(client, "rlm_result", {"run_id": run_id, "wait_s": 60})
    slow_id = (await call(client, "rlm_start", {"query": "Q-slow", "context_id": context_id}))["run_id"]
    await call(client, "rlm_cancel", {"run_id": slow_id})
    seen["cancelled"] = await call(client, "rlm_result", {"run_id": slow_id, "wait_s": 60})
    resource = await client.read_resource(f"rlm://contexts/{context_id}")
    seen["resource"] = json.loads(getattr(resource.contents[0], "text", ""))
    return seen


async def main(transport: str, target: str, folder: str) -> None:
    if transport == "stdio":
        spec = json.loads(target)
        server: Any = StdioServerParameters(command=spec["command"], args=spec["args"], env=spec["env"])
    else:
        server = streamable_http_client(target)
    async with Client(server) as client:
        print(json.dumps(await scenario(client, folder), default=str))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
