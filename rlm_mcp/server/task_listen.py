"""Task status notifications (SEP-2663's `notifications/tasks`) on `subscriptions/listen` streams.

In the 2026-07-28 revision a server has no standing stream to a client: a client opts in to
notifications with a `subscriptions/listen` request whose response is the stream (SEP-2575), and
the Tasks extension adds a `taskIds` filter to that request. A receiver MAY then send
`notifications/tasks` (the task as `tasks/get` answers it) when a listed task's status changes;
it is optional, and a requester keeps polling `tasks/get` when none comes.

- Where: on the listen stream of the request that listed the task, answered by the process that
  holds that stream. Only the tasks of the request's owner are honored: an unknown task and
  another owner's are left out of the acknowledged filter alike (nothing to probe) and never
  notified. A request that does not declare the extension is served as if it named no tasks.
- When: a run's task has one change of status, `working` to `completed` or `cancelled` (a run
  never asks for input); that change is sent once per stream. A task that already ended when the
  stream opened is sent at once, since its requester cannot have seen the change. Progress within
  `working` (its `statusMessage`) is not notified: `tasks/get` reads it.
- How the end is learnt: what the process already follows for `rlm_result(wait_s)`. Embedded mode
  waits on the run in this process; a team front follows the run's row (its mirror, woken by the
  queue's NOTIFY wake-ups and read at least every RLM_MCP_QUEUE_POLL_S), so any replica a stream
  lands on hears the end of a run executing on any worker. The run-end hook is not used: in team
  mode it fires in the process whose write ended the run, which holds no client's stream.
- Without `taskIds` the SDK's own listen handler serves the request unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import anyio
import anyio.abc
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY, ServerEvent, event_matches, event_to_notification
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    Notification,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.runs import RunResult
from rlm_mcp.server.tasks import POLL_INTERVAL_MS, TaskView, declares_tasks
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RESULT_WAIT_MAX_S

log = logging.getLogger("rlm_mcp.server")

TASK_IDS = "taskIds"
# One stream follows at most this many tasks (a follower each); further ids are not honored.
MAX_TASKS_PER_STREAM = 256
MAX_STREAMS = 1024  # as the SDK's handler: listen streams open at once
MAX_BUFFERED = 1024  # frames waiting for a stream whose client reads slowly: then it is ended


class TaskNotification(Notification[dict[str, Any], Literal["notifications/tasks"]]):
    """`notifications/tasks`: the task as `tasks/get` answers it, stamped with the subscription."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


Frame = ServerEvent | dict[str, Any]  # a bus event, or a task that changed


class TaskListen:
    """Serves `subscriptions/listen`: the SDK's handler when no tasks are named, else one stream
    that carries both the SDK's change events (of `bus`) and the named tasks' changes."""

    def __init__(
        self,
        bus: SubscriptionBus,
        caller_for: Callable[[ServerRequestContext[Any, Any]], Caller],
        view: TaskView,
    ) -> None:
        self._bus = bus
        self._plain = ListenHandler(bus)
        self._caller_for = caller_for
        self._view = view
        self._open = 0

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        named = (params.notifications.model_extra or {}).get(TASK_IDS)
        if not isinstance(named, list) or not declares_tasks(ctx):
            return await self._plain(ctx, params)
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if self._open >= MAX_STREAMS:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        try:
            caller = self._caller_for(ctx)
        except Exception as exc:  # the SDK's ToolError: no owner, or the server starting or stopping
            raise MCPError(INTERNAL_ERROR, str(exc)) from None
        owned = await self._owned(caller, named)
        self._open += 1
        try:
            return await self._serve(ctx, subscription_id, params.notifications, caller, owned)
        finally:
            self._open -= 1

    async def _owned(self, caller: Caller, named: list[Any]) -> list[str]:
        """The named tasks this owner may hear of, in the order named, each once."""
        owned: list[str] = []
        for task_id in dict.fromkeys(t for t in named if isinstance(t, str)):
            if len(owned) >= MAX_TASKS_PER_STREAM:
                break
            try:
                await caller.run_record(task_id)
            except RlmMcpError:  # unknown, another owner's, or not an id: the same silence
                continue
            owned.append(task_id)
        return owned

    async def _serve(
        self,
        ctx: ServerRequestContext[Any, Any],
        subscription_id: Any,
        requested: SubscriptionFilter,
        caller: Caller,
        owned: list[str],
    ) -> SubscriptionsListenResult:
        honored = SubscriptionFilter.model_validate(
            {
                "toolsListChanged": True if requested.tools_list_changed else None,
                "promptsListChanged": True if requested.prompts_list_changed else None,
                "resourcesListChanged": True if requested.resources_list_changed else None,
                "resourceSubscriptions": list(requested.resource_subscriptions or ()) or None,
                TASK_IDS: owned,
            }
        )
        uris = frozenset(honored.resource_subscriptions or ())
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, recv = anyio.create_memory_object_stream[Frame](MAX_BUFFERED)

        def push(frame: Frame) -> None:
            try:
                send.send_nowait(frame)
            except anyio.ClosedResourceError:
                pass
            except anyio.WouldBlock:  # the client stopped reading: end its stream (it re-listens)
                log.warning("listen stream %r backlog full; ending the stream", subscription_id)
                send.close()

        def deliver(event: ServerEvent) -> None:
            if event_matches(honored, uris, event):
                push(event)

        # Subscribed and following before the ack, as the SDK's handler: nothing is lost while the
        # ack is written, and the ack stays the first frame since only this task writes.
        unsubscribe = self._bus.subscribe(deliver)
        try:
            async with anyio.create_task_group() as tg:
                for task_id in owned:
                    tg.start_soon(self._follow, caller, task_id, push)
                await ctx.session.send_notification(
                    SubscriptionsAcknowledgedNotification(
                        params=SubscriptionsAcknowledgedNotificationParams(notifications=honored, _meta=meta)
                    ),
                    related_request_id=subscription_id,
                )
                async for frame in recv:
                    if isinstance(frame, dict):
                        notice = TaskNotification(params={**frame, "_meta": meta})
                        await ctx.session.send_notification(notice, related_request_id=subscription_id)  # type: ignore[arg-type]
                    else:
                        await ctx.session.send_notification(
                            event_to_notification(frame, meta), related_request_id=subscription_id
                        )
                tg.cancel_scope.cancel()  # the stream ended (its backlog was full): stop following
        finally:
            try:
                unsubscribe()
            finally:
                send.close()
                recv.close()
        return SubscriptionsListenResult(_meta=meta)

    async def _follow(self, caller: Caller, task_id: str, push: Callable[[Frame], None]) -> None:
        """Push the task once its status leaves `working`; waits on the run as `rlm_result` does."""
        try:
            while True:
                task = self._view.of(await caller.run_record(task_id))
                if task["status"] != "working":
                    push(task)
                    return
                waited = await caller.result(task_id, wait_s=RESULT_WAIT_MAX_S)
                if not isinstance(waited, RunResult):
                    # Not ended, and not followed from here (a front stopping, say): ask again
                    # as a polling requester would, never in a tight loop.
                    await anyio.sleep(POLL_INTERVAL_MS / 1000)
        except RlmMcpError as exc:  # its record was removed meanwhile: nothing more to say
            log.info("stopped following task %s: %s", task_id, exc)
        except Exception:  # the store unreachable: the requester still has tasks/get
            log.warning("could not follow task %s for its listen stream", task_id, exc_info=True)
