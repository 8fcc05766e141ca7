"""Periodic tasks that wake together.

A process's periodic tasks (uvicorn's once-a-second tick, `server/ticks.py`; the replica beat,
the queue gauges, the session sweeps, the LM limits' board, every 5 s; a worker's cancel poll)
each slept their own interval from whenever they last ran, so each woke the process on its own.
Waiting instead until just past the next multiple of the period on the wall clock (`until_tick`),
those with the same period, or a whole multiple of another's, come due in the same turn of the
event loop: one wake-up between them. Each still runs at least once a period (the first wait is
shorter, none longer).
"""

from __future__ import annotations

import time

import anyio

__all__ = ["sleep_to_tick", "until_tick"]

SLACK_S = 0.001  # just past the boundary: a task woken at it finds the new second begun


def until_tick(period_s: float, *, clock: float | None = None) -> float:
    """Seconds from now (`clock`: the wall clock's time) until just past the next multiple of
    `period_s` of the wall clock; in (0, period_s + SLACK_S]."""
    now = time.time() if clock is None else clock
    return period_s - now % period_s + SLACK_S


async def sleep_to_tick(period_s: float) -> None:
    """Sleep until just past the next multiple of `period_s` of the wall clock (`until_tick`)."""
    await anyio.sleep(until_tick(period_s))
