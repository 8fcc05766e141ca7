"""One listener per process that wakes the tasks waiting on a run (`RunQueuePort.listen_runs`:
a listening connection on PostgreSQL).

A notification's payload is the run id, or the run's live summary when a worker publishes one
(its one encoding: `ports.runs.encode_live` / `decode_live`), or its final record when a worker's
end write announces it (`encode_final` / `decode_announcement`): the follower applies that summary
or record without reading the row. A notification with the id alone means "read the row" (a
final status written elsewhere, a requeue, a summary or record too big for a payload). Notifications sent while this connection was down (a
PostgreSQL restart) are lost: after a reconnect every waiter is woken once and reads its row,
and while the listener hears nothing at all for a poll interval (RLM_MCP_QUEUE_POLL_S), every
waiter reads its row each interval (`watch_silence`: one timer per process, not one per run; a
waiter may still wait with a timeout of its own, `wait`'s `within_s`, as a queued run's does).
One session delivers every notification committed after its LISTEN, in commit order, so
while it hears anything at all, a quiet run is quiet, not lost; a session that died silently
hears nothing, and its waiters read their rows again within two poll intervals (its keep-alive
statement then finds it dead, and the reconnect wakes them all).

A wake-up that arrives while its follower is busy (reading the row, telling its clients) is kept
for the follower's next `wait`, never dropped. A live summary or final record that arrives while
its follower waits, with nothing kept for it, is handed to `on_carried` at once (the front applies
it to the run's mirror), so the follower is not woken for it unless `on_carried` asks (the run
left the queue, say), or declines it (the run's final record: the follower takes that itself).
"""

from __future__ import annotations

import math
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
        self._idle: set[str] = set()  # followers waiting in `wait` now, with nothing kept for them
        self._followed: anyio.Event | None = None  # `watch_silence` sleeps on it while nothing is followed
        # Applies a live summary or final record to the run's mirror (the front sets it): True
        # to wake the follower all the same (the run left the queue, say), False to leave it waiting,
        # None when not applied (kept for the follower, as without it). Unset: every wake-up wakes.
        self.on_carried: Callable[[str, LiveSummary | RunRecord], bool | None] | None = None

    def heard_within(self, within_s: float) -> bool:
        """Whether the listener heard an announcement (any run's) in the last `within_s` seconds:
        its session was alive then, so nothing announced before it was lost."""
        return self._clock() - self._heard_at < within_s

    async def wait(self, run_id: str, within_s: float) -> tuple[bool, LiveSummary | RunRecord | None]:
        """(woken, summary): woken within `within_s` (or already, since the last `wait`), and
        the live summary or final record the latest wake-up carried (None: read the row)."""
        if run_id not in self._pending:
            event = self._events.setdefault(run_id, anyio.Event())
            self._idle.add(run_id)
            try:
                if math.isinf(within_s):  # no timer of its own: `watch_silence` wakes it
                    await event.wait()
                else:
                    with anyio.move_on_after(within_s):
                        await event.wait()
            finally:
                self._idle.discard(run_id)
        self._events[run_id] = anyio.Event()  # the next wake-up is the next one
        if run_id not in self._pending:
            return False, READ_ROW
        return True, self._pending.pop(run_id)

    async def follow(self, run_id: str) -> None:
        """Keep the run's wake-ups from now on (its follower reads the row after this); returns
        once the queue's listener hears the run's announcements (its own channel)."""
        self._events.setdefault(run_id, anyio.Event())
        if self._followed is not None:
            self._followed.set()
        await self._queue.follow_run(run_id)

    def wake(self, run_id: str, summary: LiveSummary | RunRecord | None = READ_ROW) -> None:
        """Wake the run's follower, if it is followed here; `summary` is the live summary (or
        final record) a worker published with the wake-up. A later READ_ROW replaces an earlier
        summary, and a later summary replaces an earlier READ_ROW (it is newer than what the row
        held then, and a run that ended never publishes one)."""
        event = self._events.get(run_id)
        if event is None:
            return
        idle = run_id in self._idle and run_id not in self._pending and not event.is_set()
        if summary is not READ_ROW and idle and self.on_carried is not None:
            wake = self.on_carried(run_id, summary)
            if wake is not None:  # applied: the follower waits on, or is woken with nothing to read
                if wake:
                    event.set()
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

    async def watch_silence(self, poll_s: float) -> None:
        """While runs are followed: every `poll_s`, when the listener heard nothing in that
        interval (its session may be dead, announcements lost), wake every follower to read its
        row; never returns. One timer for all the runs followed here, where each follower's own
        timer woke it every interval, heard or not."""
        while True:
            if not self._events:
                self._followed = anyio.Event()
                await self._followed.wait()
                self._followed = None
            await anyio.sleep(poll_s)
            if not self.heard_within(poll_s):
                self.wake_all()

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
