"""Raw MCP Tasks requests (SEP-2663) from the Python SDK's client, which has no Tasks runtime:
`tools/call` and `tasks/*` sent as JSON-RPC through the client's session (its per-request
envelope, `Mcp-Name` header included), their results as plain JSON."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import mcp_types as types
from mcp import Client
from mcp.client import advertise
from mcp.client.extension import ClientExtension
from pydantic import BaseModel, ConfigDict

TASKS = "io.modelcontextprotocol/tasks"


class Answer(BaseModel):
    """A result as the server sent it: every field kept (`model_extra`)."""

    model_config = ConfigDict(extra="allow")


async def send(client: Client, request: RawRequest) -> dict[str, Any]:
    """Send `request` through the client's session; its result as plain JSON."""
    answer = await client.session.send_request(request, Answer)
    return dict(answer.model_extra or {})


def declaring_tasks() -> list[ClientExtension]:
    """The client extensions that make every request declare the Tasks extension."""
    return [advertise(TASKS)]


class RawRequest(types.Request[dict[str, Any] | None, str]):
    """Any request, params as given."""


class TaskRequest(RawRequest):
    """A tasks/* request: the SDK mirrors `params.taskId` into the `Mcp-Name` header."""

    name_param: ClassVar[str | None] = "taskId"


class MisroutedTaskRequest(RawRequest):
    """A tasks/* request whose `Mcp-Name` header names `params.routedTo`, not its task."""

    name_param: ClassVar[str | None] = "routedTo"


async def raw(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return await send(client, RawRequest(method=method, params=params))


async def tool_call(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    """A `tools/call` answered as JSON (a task, or the tool's result)."""
    return await raw(client, "tools/call", {"name": name, "arguments": arguments})


async def task(client: Client, method: str, task_id: str) -> dict[str, Any]:
    """`tasks/get`, `tasks/cancel` (or `tasks/update` without input) of `task_id`."""
    params: dict[str, Any] = {"taskId": task_id}
    if method == "tasks/update":
        params["inputResponses"] = {}
    return await send(client, TaskRequest(method=method, params=params))


async def settled(client: Client, task_id: str, *, within_s: float = 120) -> dict[str, Any]:
    """`tasks/get` of `task_id` until it leaves `working`, waiting as the task's pollIntervalMs says."""
    with anyio.fail_after(within_s):
        while True:
            got = await task(client, "tasks/get", task_id)
            if got["status"] != "working":
                return got
            await anyio.sleep(got.get("pollIntervalMs", 1000) / 1000)
