"""A cell's time limits: its running-time clock (paused while its code waits for the model) and
the watchdog that interrupts it at its limit or its wall-clock ceiling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlm_mcp.config import SandboxSettings

GRACE_S = 2.0


@dataclass
class CellTimeout:
    """What the cell's watchdog did, read by the cell's loop once the cell ends."""

    interrupted: bool = False  # the cell's limit passed and the kernel was sent an interrupt
    wall: bool = False  # the wall-clock ceiling passed (not the running-time limit)
    killed: bool = False  # the interrupt did not stop the cell within GRACE_S: the cell was abandoned


class CellClock:
    """Running time of a cell, paused only while the cell's own code waits for the model.

    Only a request the kernel marks as made by the main thread (the cell's code) pauses it, and
    only one at a time (that thread is blocked in it): a background thread keeping a call in
    flight used to stop the clock for good. A kernel may lie about `main`; the wall-clock
    ceiling (RLM_MCP_CELL_WALL_TIMEOUT_S) bounds the cell whatever it claims.
    """

    def __init__(self) -> None:
        self.acc = 0.0
        self.since: float | None = time.monotonic()
        self.started = time.monotonic()

    @property
    def paused(self) -> bool:
        return self.since is None

    def pause(self) -> None:
        if self.since is not None:
            self.acc += time.monotonic() - self.since
            self.since = None

    def resume(self) -> None:
        if self.since is None:
            self.since = time.monotonic()

    def running(self) -> float:
        return self.acc + (time.monotonic() - self.since if self.since is not None else 0.0)

    def wall(self) -> float:
        return time.monotonic() - self.started


class Watchdog:
    """The cell's time limits as a timer on the event loop, re-armed while the clock is paused.

    A timer rather than a task: a task per cell (spawn, cancel, join) cost several event-loop
    rounds on every cell, most of the host's time for a trivial one. On expiry it sets `state`
    and calls `expire` (which starts the interrupt in the cell's task group).
    """

    def __init__(
        self, settings: SandboxSettings, clock: CellClock, state: CellTimeout, expire: Callable[[], None]
    ) -> None:
        self._limit = settings.cell_timeout_s
        self._ceiling = settings.cell_wall_timeout_s
        self._clock = clock
        self._state = state
        self._expire = expire
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._check()

    def _check(self) -> None:
        remaining = self._limit - self._clock.running()
        wall_left = self._ceiling - self._clock.wall()
        if remaining <= 0 or wall_left <= 0:
            self._handle = None
            self._state.interrupted = True
            self._state.wall = remaining > 0
            self._expire()
            return
        # While paused the running time stands still, but the pause may end at any moment.
        delay = min(remaining, wall_left, 0.25) if self._clock.paused else min(remaining, wall_left)
        self._handle = self._loop.call_later(delay, self._check)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
