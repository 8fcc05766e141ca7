"""The team-mode gauges of /metrics (queue depth, the oldest queued run's age, live workers),
sampled from the database every `SAMPLE_S` by one task per process, so that a scrape never
waits on PostgreSQL and many scrapers cost one query per interval."""

from __future__ import annotations

import logging

from rlm_mcp.observability import metrics
from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ticks import sleep_to_tick

log = logging.getLogger("rlm_mcp.queue")

SAMPLE_S = 5.0


async def sample_forever(queue: RunQueuePort, *, every_s: float = SAMPLE_S) -> None:
    """Keep the latest sample for the metrics until cancelled; a failed query keeps nothing (the
    gauges disappear from the page rather than show stale numbers)."""
    latest: list[tuple[int, float, int] | None] = [None]
    stop = metrics.watch_team(lambda: latest[0])
    try:
        while True:
            try:
                latest[0] = await queue.gauges()
            except Exception as exc:  # the database is restarting; /healthz says so
                log.debug("could not sample the queue gauges: %s", exc)
                latest[0] = None
            await sleep_to_tick(every_s)  # with the process's other 5 s timers (rlm_mcp/ticks.py)
    finally:
        stop()
