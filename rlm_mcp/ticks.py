"""Periodic tasks that wake together.

A process's periodic tasks (uvicorn's once-a-second tick, `server/ticks.py`; the replica beat,
the queue gauges, the session sweeps, the LM limits' board, every 5 s; a worker's heartbeat,
cancel poll and idle claim look) each slept their own interval from whenever they last ran, so
each woke the process on its own. Waiting instead until just past the next multiple of the period
on the event loop's clock (`until_tick`), those with the same period, or a whole multiple of
another's, come due in the same turn of the event loop: one wake-up between them. Each still
runs at least once a period (the first wait is shorter, none longer).

The multiples are shifted by a phase of the process's own (`PHASE_S`, from its pid), so that
the processes of one host (a team's replicas) do not all wake, and all query PostgreSQL, at
the same instant.
"""

from __future__ import annotations

import os

import anyio

__all__ = ["PHASE_S", "next_tick", "sleep_to_tick", "until_tick"]

SLACK_S = 0.001  # just past the instant: a task woken at it finds its period begun
PHASE_S = (os.getpid() * 0.6180339887) % 1.0  # this process's ticks, in [0, 1) s past the loop clock's whole seconds


def until_tick(period_s: float, *, clock: float | None = None) -> float:
    """Seconds from now (`clock`: the event loop's time, `anyio.current_time()`) until just past
    this process's next tick of `period_s` (a multiple of it, shifted by `PHASE_S`); in
    (0, period_s + SLACK_S]."""
    now = anyio.current_time() if clock is None else clock
    return period_s - (now - PHASE_S) % period_s + SLACK_S


def next_tick(period_s: float, after: float) -> float:
    """The event loop's time of this process's first tick of `period_s` past the instant `after`
    (on the loop's clock): tasks that wait for it wake in the same turn of the loop."""
    return after + until_tick(period_s, clock=after)


async def sleep_to_tick(period_s: float) -> None:
    """Sleep until just past this process's next tick of `period_s` (`until_tick`)."""
    await anyio.sleep(until_tick(period_s))
