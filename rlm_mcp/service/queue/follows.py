"""Which of a worker's runs a front follows, and so how often the worker publishes each one's
live summary (`publishing.publish_until_done`).

A run someone follows (a caller with a progress token, an event stream, which the viewer's live
page opens: each says so through `RunBackend.follow_progress`) is published every
RLM_MCP_LIVE_SUMMARY_INTERVAL_S; a run nobody follows every
RLM_MCP_LIVE_SUMMARY_UNFOLLOWED_INTERVAL_S (its staged events still every RLM_MCP_QUEUE_POLL_S).
The worker learns of a follow three ways: the run's row says so when it is claimed (a follow
sent while it was queued), a "follow RUN_ID" note on the queue's wake-ups (a follow of a running
run; it may arrive before the claim's own answer, so notes are kept for runs not yet held here),
and, after its listener reconnected (notes sent meanwhile are lost), one read of the held runs'
marks. A follow is a hint for latency only: fencing, the final record, the first LM call's mark,
the run log's writes and what a process's death loses never depend on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from rlm_mcp.config import PublishSettings
from rlm_mcp.lru import LruMap

NOTES_KEPT = 4096  # follow notes remembered for runs not held here (another worker's, or not yet claimed)


class FollowedRuns:
    def __init__(self, publish: PublishSettings) -> None:
        self._publish = publish
        self._ids: LruMap[str, None] = LruMap(NOTES_KEPT)
        # The listener (re)connected: notes sent while it was down are lost, so the held runs'
        # marks are read once (`QueueWorker._poll_cancels`).
        self.recheck = False
        self._waits: dict[str, anyio.CancelScope] = {}  # run id -> its publisher's wait for the interval

    def mark(self, run_id: str) -> None:
        """The run is followed: its publisher's wait for the slower interval ends now."""
        self._ids.put(run_id, None)
        if (scope := self._waits.get(run_id)) is not None:
            scope.cancel()

    @contextmanager
    def waiting(self, run_id: str, for_s: float) -> Iterator[None]:
        """A scope for the run's publisher to wait in: ends after `for_s`, or when the run is
        marked followed."""
        with anyio.move_on_after(for_s) as scope:
            self._waits[run_id] = scope
            try:
                yield
            finally:
                self._waits.pop(run_id, None)

    def forget(self, run_id: str) -> None:
        self._ids.pop(run_id)

    def followed(self, run_id: str) -> bool:
        return run_id in self._ids

    def interval(self, run_id: str) -> float:
        """The run's live-summary interval now (a follow may arrive mid-run)."""
        if self.followed(run_id):
            return self._publish.live_summary_interval_s
        return self._publish.live_summary_unfollowed_interval_s
