"""Task status notifications (SEP-2663 `notifications/tasks` on a SEP-2575 `subscriptions/listen`
stream, server/task_listen.py), received by the Python SDK's client over streamable HTTP with a
bearer token: the owner's stream is told its task's new status (cancelled, completed, with the
result inline) with the task id and the stream's subscription id; another token naming the same
task gets it left out of its acknowledged filter and is told nothing; on a team, a stream on one
replica hears the end of a task another accepted. Real Docker sandboxes, the scripted LM, both
stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel, ConfigDict

from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port
from tests.fixtures_http import serving
from tests.fixtures_surface import ANSWER_NOW, STUCK, call, make_settings
from tests.fixtures_tasks import TASKS, RawRequest, send, task, tool_call
from tests.fixtures_team import team_replica

pytestmark = pytest.mark.anyio

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ALICE = "alice-token"


class Notice(BaseModel):
    """A notification's params as sent, every field kept (`_meta` too)."""

    model_config = ConfigDict(extra="allow")


class Listener(ClientExtension):
    """Declares the Tasks extension and keeps what arrives on this client's listen streams: the
    `notifications/tasks` params (through the extension's binding) and the acknowledged filters."""

    identifier = TASKS

    def __init__(self) -> None:
        self.tasks_send, self.tasks = anyio.create_memory_object_stream[dict[str, Any]](64)
        self.acks_send, self.acks = anyio.create_memory_object_stream[dict[str, Any]](64)

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/tasks", params_type=Notice, handler=self._task)]

    async def _task(self, params: Notice) -> None:
        await self.tasks_send.send(dict(params.model_extra or {}))

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.SubscriptionsAcknowledgedNotification):
            await self.acks_send.send(message.params.notifications.model_dump(by_alias=True, exclude_none=True))


@asynccontextmanager
async def listening_client(url: str, token: str) -> AsyncIterator[tuple[Client, Listener]]:
    listener = Listener()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    transport = streamable_http_client(url, http_client=http)
    try:
        async with http, Client(transport, extensions=[listener], message_handler=listener.on_message) as client:
            yield client, listener
    finally:
        for stream in (listener.tasks_send, listener.tasks, listener.acks_send, listener.acks):
            stream.close()


@asynccontextmanager
async def listening(client: Client, listener: Listener, task_ids: list[str]) -> AsyncIterator[dict[str, Any]]:
    """A `subscriptions/listen` stream naming `task_ids`, open for the block; its acknowledged
    filter."""
    request = RawRequest(method="subscriptions/listen", params={"notifications": {"taskIds": task_ids}})
    async with anyio.create_task_group() as tg:
        tg.start_soon(send, client, request)
        with anyio.fail_after(60):
            acked = await listener.acks.receive()
        yield acked
        tg.cancel_scope.cancel()


async def next_task(listener: Listener) -> dict[str, Any]:
    with anyio.fail_after(120):
        return await listener.tasks.receive()


def _http_settings(tmp_path: Path, base_url: str, **overrides: Any) -> Any:
    return make_settings(
        tmp_path,
        base_url,
        host="127.0.0.1",
        port=free_port("127.0.0.1"),
        auth_tokens=["alice-token", "bob-token"],
        cell_timeout_s=600,
        **overrides,
    )


async def _working(client: Client, task_id: str) -> None:
    """Until the run's first turn is under way (its status message says so)."""
    with anyio.fail_after(60):
        while not (await task(client, "tasks/get", task_id))["statusMessage"].startswith("turn 1/"):
            await anyio.sleep(0.2)


async def test_the_owners_stream_is_told_the_new_status_and_another_token_nothing(
    tmp_path: Path, database_url: str | None
) -> None:
    script = Script(
        root_by_query=[RootScript(match="STUCK-Q", replies=[STUCK]), RootScript(match="OK-Q", replies=[ANSWER_NOW])]
    )
    with ScriptedLM(script) as lm:
        settings = _http_settings(tmp_path, lm.base_url, database_url=database_url)
        async with (
            serving(settings) as url,
            listening_client(url, "alice-token") as (alice, alice_hears),
            listening_client(url, "bob-token") as (bob, bob_hears),
        ):
            context_id = (await call(alice, "rlm_load_context", text="c"))["context_id"]
            stuck = (await tool_call(alice, "rlm_complete", query="STUCK-Q", context_id=context_id))["taskId"]
            await _working(alice, stuck)
            unknown = "run_00000000000000000000"
            async with (
                listening(alice, alice_hears, [stuck, unknown, stuck]) as alice_ack,
                listening(bob, bob_hears, [stuck]) as bob_ack,
            ):
                # Only the owner's own task is honored; an unknown one and another's alike are not.
                assert alice_ack["taskIds"] == [stuck], alice_ack
                assert bob_ack["taskIds"] == [], bob_ack
                await task(alice, "tasks/cancel", stuck)
                told = await next_task(alice_hears)
                assert told["taskId"] == stuck and told["status"] == "cancelled", told
                assert told["_meta"][SUBSCRIPTION_ID] is not None
                assert (await task(alice, "tasks/get", stuck))["status"] == "cancelled"

                # A task that completes while the stream is open: the result rides inline.
                done = (await tool_call(alice, "rlm_complete", query="OK-Q", context_id=context_id))["taskId"]
            async with listening(alice, alice_hears, [done]) as ack:
                assert ack["taskIds"] == [done]
                told = await next_task(alice_hears)  # ended before or after the ack: told once either way
                assert told["taskId"] == done and told["status"] == "completed", told
                assert told["result"]["structuredContent"]["answer"] == "forty-two"
                assert told["result"]["isError"] is False
            # Bob's stream named Alice's task and was told nothing of it.
            assert bob_hears.tasks.statistics().current_buffer_used == 0


async def test_a_stream_on_one_replica_hears_a_task_another_accepted(tmp_path: Path, pg_url: str) -> None:
    """Two `rlm-mcp serve` processes on one PostgreSQL database: A runs the task it accepted
    (role both), the stream is on B (a front), which learns the end by following the run's row."""
    with (
        ScriptedLM(Script(root=[STUCK])) as lm,
        team_replica(tmp_path / "a", role="both", database_url=pg_url, lm_url=lm.base_url, tokens=[ALICE]) as a,
        team_replica(tmp_path / "b", role="front", database_url=pg_url, lm_url=lm.base_url, tokens=[ALICE]) as b,
    ):
        async with (
            listening_client(f"{a.base}/mcp", ALICE) as (on_a, _),
            listening_client(f"{b.base}/mcp", ALICE) as (on_b, b_hears),
        ):
            context_id = (await call(on_a, "rlm_load_context", text="c"))["context_id"]
            task_id = (await tool_call(on_a, "rlm_complete", query="q", context_id=context_id))["taskId"]
            await _working(on_a, task_id)
            async with listening(on_b, b_hears, [task_id]) as ack:
                assert ack["taskIds"] == [task_id]
                await task(on_a, "tasks/cancel", task_id)  # ended on A, by A
                told = await next_task(b_hears)
            assert told["taskId"] == task_id and told["status"] == "cancelled", told
