"""One LISTEN connection per process that wakes the tasks waiting on a run (`records.CHANNEL`).

NOTIFY is only a wake-up: a waiter always reads the run's row after it, and polls anyway
(RLM_MCP_QUEUE_POLL_S), because notifications sent while this connection was down (a PostgreSQL
restart) are lost. After a reconnect every waiter is woken once, for the same reason.
"""

from __future__ import annotations

import logging

import anyio
import psycopg

from rlm_mcp.service.queue.records import CHANNEL

log = logging.getLogger("rlm_mcp.queue")

RECONNECT_S = 1.0
KEEPALIVE_S = 10.0
CONNECT_TIMEOUT_S = 10


class Wakeups:
    def __init__(self, url: str) -> None:
        self._url = url
        self._events: dict[str, anyio.Event] = {}

    async def wait(self, run_id: str, within_s: float) -> bool:
        """True if the run was notified (or the connection came back) within `within_s`."""
        event = self._events.setdefault(run_id, anyio.Event())
        with anyio.move_on_after(within_s):
            await event.wait()
            return True
        return False

    def wake(self, run_id: str) -> None:
        event = self._events.pop(run_id, None)
        if event is not None:
            event.set()

    def forget(self, run_id: str) -> None:
        """Drop the run's wake-up (nobody follows it any more)."""
        self._events.pop(run_id, None)

    def wake_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    async def listen_forever(self) -> None:
        """Keep one LISTEN connection open, reconnecting after any failure."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.wake_all()  # what was sent while we were away is lost: look again
                    while True:
                        async for note in conn.notifies(timeout=KEEPALIVE_S):
                            self.wake(note.payload)
                        await conn.execute("SELECT 1")  # notices a dead connection
            except Exception as exc:  # psycopg.Error, OSError: whatever it was, listen again
                log.info("run progress listener lost its connection (%s); reconnecting", type(exc).__name__)
            await anyio.sleep(RECONNECT_S)
