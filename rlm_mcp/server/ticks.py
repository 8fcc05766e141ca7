"""uvicorn's server with a main loop that sleeps until there is something to do.

`uvicorn.Server.main_loop` wakes every 0.1 s to look at `should_exit` and, every tenth time,
refresh the `date` header its responses carry. With nothing happening that tick was most of an
idle process's wake-ups (ten a second, the embedded server's nearly all). Here the loop sleeps
until this process's next one-second tick (`rlm_mcp.ticks`, shared with its other periodic tasks;
the header is as fresh as uvicorn's, whose refresh is up to a second late) or until `should_exit`
is set, whichever comes first: setting it, from uvicorn's signal handler (SIGINT, SIGTERM) or
anywhere else, wakes the loop at once, so stopping is as prompt as before. Nothing else differs: `on_tick` is uvicorn's own, told to refresh
the header on every tick (with `limit_max_requests` set, the count is also looked at once a second).
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

from rlm_mcp.ticks import until_tick

__all__ = ["TickingServer"]

TICK_S = 1.0  # uvicorn's date header has a resolution of one second


class TickingServer(uvicorn.Server):
    """`uvicorn.Server`, its main loop woken by its once-a-second tick or a request to stop."""

    _should_exit = False
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        loop, stop = self._loop, self._stop
        if value and loop is not None and stop is not None and not loop.is_closed():
            # Thread-safe and safe in a signal handler (it runs in the loop's thread between two
            # bytecodes): the loop's self-pipe wakes it from its wait.
            loop.call_soon_threadsafe(stop.set)

    async def main_loop(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        if self._should_exit:  # set before the loop was known
            self._stop.set()
        try:
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                # uvicorn's on_tick refreshes the date header when the counter is a multiple of 10.
                counter = (counter + 10) % 864000
                wait_s = until_tick(TICK_S)  # once a second, with the 5 s timers (rlm_mcp/ticks.py)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait_s)
                should_exit = await self.on_tick(counter)
        finally:
            self._loop = self._stop = None
