"""A run's event stream: server-sent events of its typed run events, read from the run store.

`GET /runs/api/runs/{run_id}/events` (the viewer's door: a bearer token, or in a browser the
viewer's session cookie under `/runs/s/<key>/`, which `EventSource` sends by itself). Each event
is one SSE message: `id` its key in the log (`attempt-seq`, `events.EventKey`), `event` its type
(`run_start`, `turn`, `cell`, `sub_calls`, `llm_call`, `run_end`, ...), `data` the JSON object
the run log holds. A team run that a worker handed back, or that was requeued after its worker
was lost, goes on under a new attempt: the stream says so with a `restart` event (id
`attempt-r`) before the new attempt's events. Once the run has ended and every event has been
sent, an `end` event (id `end`, data: run id and status) closes the stream; a client that
reconnects after it is answered 204 (which tells `EventSource` to stop).

Resuming: a client that sends `Last-Event-ID` gets the events after that key, so a dropped
connection loses and repeats nothing. The events come from the store (the run's file log, or
PostgreSQL's rows in team mode), so any replica serves any run's stream.

Bounds (`config.events`): streams open at once in total and per owner (429 past them), a stream
with no new event for the idle time or open for the maximum time is closed (the client resumes),
and a comment line is sent on a quiet stream every heartbeat interval, so proxies keep it open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import typing
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from starlette.types import Receive, Scope, Send

from rlm_mcp.config import EventSettings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import EventKey, LoggedEvent, RunEvent, to_json
from rlm_mcp.owners import OwnerScope
from rlm_mcp.store.ports import RunStorePort

log = logging.getLogger("rlm_mcp.viewer")

END_ID = "end"
BATCH = 200  # events read per store call
# The SSE event names a run's stream uses before its `end` (a browser's EventSource has no
# wildcard listener: the run page listens to each of these).
EVENT_TYPES: tuple[str, ...] = (
    *(str(kind.model_fields["type"].default) for kind in typing.get_args(typing.get_args(RunEvent)[0])),
    "restart",
    "unknown",
)


def parse_last_event_id(value: str | None) -> EventKey | str | None:
    """The key a client's `Last-Event-ID` names (`attempt-seq`; `attempt-r`: the restart
    event, before the attempt's first event), END_ID, or None (absent or not ours: from the start)."""
    if value is None:
        return None
    value = value.strip()
    if value == END_ID:
        return END_ID
    attempt, sep, seq = value.partition("-")
    if not sep or not attempt.isdigit():
        return None
    if seq == "r":
        return EventKey(int(attempt), -1)
    return EventKey(int(attempt), int(seq)) if seq.isdigit() else None


def sse_message(data: object, *, event: str | None = None, id: str | None = None) -> bytes:
    """One SSE message; `data` as one line of JSON (json escapes every newline)."""
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, default=str))
    return ("\n".join(lines) + "\n\n").encode()


def _event_message(key: EventKey, event: LoggedEvent) -> bytes:
    return sse_message(to_json(event), event=event.type or "unknown", id=f"{key.attempt}-{key.seq}")


@dataclass
class StreamSlots:
    """Streams open now, in total and per owner (one process's: each replica bounds its own)."""

    settings: EventSettings
    _open: Counter[str] = field(default_factory=Counter)

    def take(self, owner: OwnerScope) -> bool:
        name = str(owner)
        if sum(self._open.values()) >= self.settings.event_streams_max:
            return False
        if self._open[name] >= self.settings.event_streams_per_owner:
            return False
        self._open[name] += 1
        return True

    def give_back(self, owner: OwnerScope) -> None:
        name = str(owner)
        self._open[name] -= 1
        if self._open[name] <= 0:
            del self._open[name]

    @property
    def open(self) -> int:
        return sum(self._open.values())


async def run_messages(
    records: RunStorePort, run_id: str, owner: OwnerScope, after: EventKey | None, settings: EventSettings
) -> AsyncIterator[bytes]:
    """The stream's messages: the run's events after `after`, restarts, heartbeats, the end.
    Ends at the run's end, after the idle time without an event, or at the maximum duration."""
    started = last_event = last_sent = time.monotonic()
    seen_attempt = after.attempt if after is not None else 0
    version: str | None = None
    while True:
        now = time.monotonic()
        # The record first: if it says done, every event was written before it (both stores
        # write the events, then the final record), so an empty read after it means the end.
        record = await records.read_summary(run_id, owner=owner)
        current = await records.version(run_id)
        rows: list[tuple[EventKey, LoggedEvent]] = []
        if current != version or record.done:
            rows = await records.events_after(run_id, owner=owner, after=after, limit=BATCH)
            if len(rows) < BATCH:
                version = current  # all read up to this version; a full batch reads on at once
        for key, event in rows:
            if key.attempt > 1 and key.attempt > seen_attempt:  # a requeued run began again
                yield sse_message({"run_id": run_id, "attempt": key.attempt}, event="restart", id=f"{key.attempt}-r")
            seen_attempt = max(seen_attempt, key.attempt)
            yield _event_message(key, event)
            after = key
        if rows:
            last_event = last_sent = now
            if len(rows) == BATCH:
                continue
        elif record.done:
            yield sse_message({"run_id": run_id, "status": record.status}, event="end", id=END_ID)
            return
        if now - last_event >= settings.event_stream_idle_s or now - started >= settings.event_stream_max_s:
            return  # the client reconnects with Last-Event-ID
        if now - last_sent >= settings.event_stream_heartbeat_s:
            yield b": keep-alive\n\n"
            last_sent = now
        await anyio.sleep(settings.event_stream_poll_s)


class EventStreamResponse:
    """The SSE response (an ASGI app): sends the messages until they end or the client goes,
    then gives its slot back, whatever happened."""

    def __init__(self, messages: AsyncIterator[bytes], release: StreamSlots, owner: OwnerScope) -> None:
        self._messages = messages
        self._slots = release
        self._owner = owner
        self._held = True

    def _release(self) -> None:
        if self._held:
            self._held = False
            self._slots.give_back(self._owner)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-store"),
                        (b"x-content-type-options", b"nosniff"),
                        (b"x-accel-buffering", b"no"),  # nginx: pass each message on at once
                    ],
                }
            )
            async with anyio.create_task_group() as tg:

                async def gone() -> None:  # the client closed the connection: stop reading
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(gone)
                try:
                    async for message in self._messages:
                        await send({"type": "http.response.body", "body": message, "more_body": True})
                except (RlmMcpError, OSError) as exc:  # the run was pruned, the store went away
                    log.info("event stream ended early: %s", exc)
                # The slot is free before the client sees the end: it may open the next at once.
                self._release()
                with contextlib.suppress(OSError):  # the client may be gone already
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        finally:
            self._release()
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._messages, "aclose", None)
                if aclose is not None:
                    await aclose()
