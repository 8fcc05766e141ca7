"""`QuietGate`: background Docker work waits until no run is using a sandbox.

Starting a pool container or removing a used one costs the daemon ~0.1-0.2 s of CPU (and this
process a few ms in docker-py). On a 2-core host that work, done the moment a run takes or
returns a container, lands on the run's own critical path (measured: +20 ms on a one-turn run).
So the pool refill and the background removals ask this gate first: it opens once no sandbox
has been in use for `settle_s` (long enough for a finished run's record and result to go out),
and after `max_wait_s` whatever happens, so a server that is never idle still refills and cleans
(the refill, while the pool still holds at least half its size, after `REFILL_MAX_WAIT_S`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

SETTLE_S = 0.05
MAX_WAIT_S = 1.0
# The warm pool's refill waits longer while it still holds at least half its size (below that,
# the gate's own bound; an empty pool refills at once): one container start costs the daemon a few hundred ms of CPU, and started a second into
# a run it landed on that run's cells and requests (measured: a child run's sub-call 80-110 ms
# late on the 2-core VM). Removals keep `MAX_WAIT_S`: past their bound a finishing run removes
# its own container.
REFILL_MAX_WAIT_S = 10.0


def refill_wait_s(ready: int, size: int) -> float | None:
    """How long a pool holding `ready` of its `size` containers waits for quiet before starting
    another: `REFILL_MAX_WAIT_S` while it holds at least half, else the gate's own bound (None)."""
    return REFILL_MAX_WAIT_S if ready * 2 >= size else None


class QuietGate:
    """Counts sandboxes in use; `wait_quiet()` returns when none has been for a moment."""

    def __init__(self, *, settle_s: float = SETTLE_S, max_wait_s: float = MAX_WAIT_S) -> None:
        self.settle_s = settle_s
        self.max_wait_s = max_wait_s
        self._busy = 0
        self._generation = 0  # counts busy periods, so a short one inside the settle time is seen
        self._idle: anyio.Event | None = None  # created in the event loop, on the first use

    @property
    def busy(self) -> int:
        return self._busy

    @asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        """Mark one sandbox as in use for the block."""
        if self._busy == 0:
            self._generation += 1
            self._idle = anyio.Event()
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0 and self._idle is not None:
                self._idle.set()

    async def wait_quiet(self, max_wait_s: float | None = None) -> None:
        """Return once no sandbox has been in use for `settle_s`, or after `max_wait_s` (the
        gate's own when None)."""
        with anyio.move_on_after(self.max_wait_s if max_wait_s is None else max_wait_s):
            while True:
                if self._busy and self._idle is not None:
                    await self._idle.wait()
                generation = self._generation
                await anyio.sleep(self.settle_s)
                if self._busy == 0 and self._generation == generation:
                    return
