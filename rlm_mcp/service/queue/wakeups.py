"""One listener per process that tells the front of each announcement of a run it follows
(`RunQueuePort.listen_runs`: a listening connection on PostgreSQL).

A notification's payload is the run id, or the run's live summary when a worker publishes one
(its one encoding: `ports.runs.encode_live` / `decode_live`), or its final record when a worker's
end write announces it (`encode_final` / `decode_announcement`): the front applies that summary
or record to the run's mirror without reading the row. A notification with the id alone means
"read the row" (a final status written elsewhere, a requeue, a summary or record too big for a
payload). Each is handed to `on_wake` at once, in the listener's own callback: no task per
followed run waits for them (the front starts one only to read a row). Notifications sent while
this connection was down (a PostgreSQL restart) are lost: after a reconnect every followed run
is told to read its row once. One session delivers every notification committed after its
LISTEN, in commit order, so while it is alive a quiet run is quiet, not lost. So when the
listener has heard nothing for a poll interval (RLM_MCP_QUEUE_POLL_S) while runs are followed,
its session is asked for one round trip (`watch_silence`: one timer per process, not one per
run): answered within the next interval, nothing was lost and nobody reads a row; not answered
(a session that died silently, or no listener connected), every followed run reads its row,
within two poll intervals of the silence's start (and the reconnect tells them all again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import LiveSummary, RunRecord, decode_announcement

READ_ROW = None  # a wake-up that carried nothing: the follower must read the row


class Wakeups:
    def __init__(self, queue: RunQueuePort, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._queue = queue
        self._clock = clock
        self._followed: set[str] = set()  # the run ids followed here through the listener
        # Runs this process's own worker was offered (`local.LocalLane`): their wake-ups come
        # in-process (`wake_local`), none from the listener, and no silence wakes them.
        self._local: set[str] = set()
        self._heard_at = float("-inf")  # monotonic: the listener's last announcement, any run's
        self._any: anyio.Event | None = None  # `watch_silence` sleeps on it while nothing is followed
        # Told of each wake-up of a followed run: the live summary or final record it carried, or
        # READ_ROW. Called in the listener's callback (or `wake`'s caller's): it must not block.
        self.on_wake: Callable[[str, LiveSummary | RunRecord | None], None] | None = None

    def heard_within(self, within_s: float) -> bool:
        """Whether the listener heard an announcement (any run's) in the last `within_s` seconds:
        its session was alive then, so nothing announced before it was lost."""
        return self._clock() - self._heard_at < within_s

    async def follow(self, run_id: str) -> None:
        """Hand the run's wake-ups to `on_wake` from now on (its follower reads the row after
        this); returns once the queue's listener hears the run's announcements (its own channel).
        A run followed locally until now is followed through the listener from now on."""
        self._local.discard(run_id)
        self._followed.add(run_id)
        if self._any is not None:
            self._any.set()
        await self._queue.follow_run(run_id)

    def follow_local(self, run_id: str) -> None:
        """Hand the run's in-process wake-ups (`wake_local`) to `on_wake` from now on, without a
        LISTEN: this process's own worker was offered it (`local.LocalLane`)."""
        self._local.add(run_id)

    def wake_local(self, run_id: str, record: RunRecord) -> None:
        """What an announcement of a run followed locally carried, handed over in-process by this
        process's worker once its write committed."""
        if run_id in self._local and self.on_wake is not None:
            self.on_wake(run_id, record)

    def wake(self, run_id: str, summary: LiveSummary | RunRecord | None = READ_ROW) -> None:
        """Tell the run's follower, if it is followed here; `summary` is the live summary (or
        final record) a worker published with the wake-up, READ_ROW when only the row tells."""
        if (run_id in self._followed or run_id in self._local) and self.on_wake is not None:
            self.on_wake(run_id, summary)

    def forget(self, run_id: str) -> None:
        """Nobody follows the run here any more."""
        self._local.discard(run_id)
        if run_id in self._followed:
            self._followed.discard(run_id)
            self._queue.forget_run(run_id)

    def wake_all(self) -> None:
        for run_id in list(self._followed):
            self.wake(run_id)

    async def watch_silence(self, poll_s: float) -> None:
        """While runs are followed: every `poll_s`, when the listener heard nothing in that
        interval (its session may be dead, announcements lost), ask its session for a round trip
        (`RunQueuePort.listener_alive`), and when that is not answered within `poll_s`, tell every
        followed run to read its row; never returns. One timer for all the runs followed here:
        a quiet team costs one statement per interval, not a row read per followed run."""
        while True:
            if not self._followed:
                self._any = anyio.Event()
                await self._any.wait()
                self._any = None
            await anyio.sleep(poll_s)
            if self.heard_within(poll_s) or not self._followed:
                continue
            if await self._queue.listener_alive(poll_s):
                self._heard_at = self._clock()
            else:
                self.wake_all()

    async def listen_forever(self) -> None:
        """Keep listening, reconnecting after any failure (the queue's `listen_runs`)."""

        def on_note(payload: str) -> None:
            self._heard_at = self._clock()
            # A replica hears the runs it follows (each run's own channel), but also an earlier
            # version's workers' announcements of every run, and a run it stopped following may
            # still be listened to: a run not followed here is let go before its summary is parsed.
            if payload.partition(" ")[0] not in self._followed:
                return
            run_id, carried = decode_announcement(payload)
            self.wake(run_id, carried)

        # What was sent while the connection was down is lost: every follower looks again.
        await self._queue.listen_runs(on_note, on_connect=self.wake_all)
