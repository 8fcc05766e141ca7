"""A front's queued runs' no-worker notice: while a run a front mirrors is queued and no worker is
alive, `rlm_status` says so (`NoticeKind.NO_WORKER`, with the queue timeout), until one comes.

One task for every queued run (`watch_forever`), where each run's own task looked every poll
interval: it reads the live workers' count when it is due (at most once a poll interval,
RLM_MCP_QUEUE_POLL_S, and only while runs are queued here) and gives each queued run its notice.
"""

from __future__ import annotations

import time

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import Notice, NoticeKind
from rlm_mcp.service.active_run import ActiveRun


class NoWorkerNotices:
    def __init__(self, settings: QueueSettings, queue: RunQueuePort) -> None:
        self._settings = settings
        self._queue = queue
        self._live_workers = 0
        self._workers_seen_at = float("-inf")
        self._queued: dict[str, ActiveRun] = {}  # mirrored runs still queued: their no-worker notice
        self._queued_added: anyio.Event | None = None  # `watch_forever` sleeps on it while none is
        self._queued_nap: anyio.CancelScope | None = None  # its wait for the next poll interval

    def watch(self, run: ActiveRun) -> None:
        """Give a queued run its notice now when the count is recent, else have `watch_forever`
        read the count now; a run that is not queued needs none."""
        if run.done.is_set() or run.progress.status != "queued":
            return
        self._queued[run.run_id] = run
        if self._queued_added is not None:
            self._queued_added.set()
        if not self._workers_due():
            self._notice(run)
        elif self._queued_nap is not None:
            self._queued_nap.cancel()

    def drop(self, run_id: str) -> None:
        """The run ended, or is not followed here any more."""
        self._queued.pop(run_id, None)

    async def watch_forever(self) -> None:
        """While runs are queued here: read the live workers' count when it is due and give each
        queued run its notice; never returns."""
        while True:
            if not self._queued:
                self._queued_added = anyio.Event()
                await self._queued_added.wait()
                self._queued_added = None
            # The database is restarting when the read fails: say nothing new.
            if not self._workers_due() or await self._read_live_workers():
                for run in list(self._queued.values()):
                    if run.done.is_set() or run.progress.status != "queued":
                        self._queued.pop(run.run_id, None)
                    else:
                        self._notice(run)
            with anyio.move_on_after(self._settings.queue_poll_s) as nap:
                self._queued_nap = nap
                await anyio.sleep_forever()
            self._queued_nap = None

    def _notice(self, run: ActiveRun) -> None:
        """A queued run with no live worker says so (rlm_status), after the record's own notice
        (such as "queued again"), until one comes: by the live workers' count last read."""
        waiting = None
        if self._live_workers == 0:
            waiting = Notice(kind=NoticeKind.NO_WORKER, wait_s=self._settings.run_queue_timeout_s)
        if run.waiting != waiting:
            run.waiting = waiting
            run.notify("queued")

    def _workers_due(self) -> bool:
        return time.monotonic() - self._workers_seen_at >= self._settings.queue_poll_s

    async def _read_live_workers(self) -> bool:
        """Read the live workers' count (only `watch_forever` does: a burst's runs never each
        ask). False when it failed."""
        started = time.monotonic()
        try:
            self._live_workers = await self._queue.live_workers()
        except Exception:  # the caller says nothing new; the next due read tries again
            return False
        self._workers_seen_at = started
        return True
