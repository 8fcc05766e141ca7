"""One listener per process that wakes the tasks waiting on a run (`RunQueuePort.listen_runs`:
a listening connection on PostgreSQL).

A notification's payload is the run id, or the run's live summary when a worker publishes one
(its one encoding: `ports.runs.encode_live` / `decode_live`), or its final record when a worker's
end write announces it (`encode_final` / `decode_announcement`): the follower applies that summary
or record without reading the row. A notification with the id alone means "read the row" (a
final status written elsewhere, a requeue, a summary or record too big for a payload). Notifications sent while this connection was down (a
PostgreSQL restart) are lost: after a reconnect every waiter is woken once and reads its row,
and a waiter that heard nothing for a poll interval (RLM_MCP_QUEUE_POLL_S) reads its row too,
unless the listener heard an announcement (any run's) within that interval (`heard_within`).
One session delivers every notification committed after its LISTEN, in commit order, so
while it hears anything at all, a quiet run is quiet, not lost; a session that died silently
hears nothing, and its waiters read their rows again within two poll intervals (its keep-alive
statement then finds it dead, and the reconnect wakes them all).

A wake-up that arrives while its follower is busy (reading the row, telling its clients) is kept
for the follower's next `wait`, never dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import LiveSummary, RunRecord, decode_announcement

READ_ROW = None  # what `wait` returns when the follower must read the row


class Wakeups:
    def __init__(self, queue: RunQueuePort, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._queue = queue
        self._clock = clock
        self._events: dict[str, anyio.Event] = {}  # by followed run id
        # A wake-up not yet taken by its follower: the latest live summary, the final record, or READ_ROW.
        self._pending: dict[str, LiveSummary | RunRecord | None] = {}
        self._heard_at = float("-inf")  # monotonic: the listener's last announcement, any run's

    def heard_within(self, within_s: float) -> bool:
        """Whether the listener heard an announcement (any run's) in the last `within_s` seconds:
        its session was alive then, so nothing announced before it was lost."""
        return self._clock() - self._heard_at < within_s

    async def wait(self, run_id: str, within_s: float) -> tuple[bool, LiveSummary | RunRecord | None]:
        """(woken, summary): woken within `within_s` (or already, since the last `wait`), and
        the live summary or final record the latest wake-up carried (None: read the row)."""
        if run_id not in self._pending:
            event = self._events.setdefault(run_id, anyio.Event())
            with anyio.move_on_after(within_s):
                await event.wait()
        self._events[run_id] = anyio.Event()  # the next wake-up is the next one
        if run_id not in self._pending:
            return False, READ_ROW
        return True, self._pending.pop(run_id)

    async def follow(self, run_id: str) -> None:
        """Keep the run's wake-ups from now on (its follower reads the row after this); returns
        once the queue's listener hears the run's announcements (its own channel)."""
        self._events.setdefault(run_id, anyio.Event())
        await self._queue.follow_run(run_id)

    def wake(self, run_id: str, summary: LiveSummary | RunRecord | None = READ_ROW) -> None:
        """Wake the run's follower, if it is followed here; `summary` is the live summary (or
        final record) a worker published with the wake-up. A later READ_ROW replaces an earlier
        summary, and a later summary replaces an earlier READ_ROW (it is newer than what the row
        held then, and a run that ended never publishes one)."""
        event = self._events.get(run_id)
        if event is None:
            return
        self._pending[run_id] = summary
        event.set()

    def forget(self, run_id: str) -> None:
        """Drop the run's wake-up (nobody follows it any more)."""
        self._events.pop(run_id, None)
        self._pending.pop(run_id, None)
        self._queue.forget_run(run_id)

    def wake_all(self) -> None:
        for run_id in list(self._events):
            self.wake(run_id)

    async def listen_forever(self) -> None:
        """Keep listening, reconnecting after any failure (the queue's `listen_runs`)."""

        def on_note(payload: str) -> None:
            self._heard_at = self._clock()
            # A replica hears the runs it follows (each run's own channel), but also an earlier
            # version's workers' announcements of every run, and a run it stopped following may
            # still be listened to: a run not followed here is let go before its summary is parsed.
            if payload.partition(" ")[0] not in self._events:
                return
            run_id, carried = decode_announcement(payload)
            self.wake(run_id, carried)

        # What was sent while the connection was down is lost: every follower looks again.
        await self._queue.listen_runs(on_note, on_connect=self.wake_all)
