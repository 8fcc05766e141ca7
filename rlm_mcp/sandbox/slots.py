"""`SandboxSlots`: the cap on sandboxes open at once, without deadlock under recursion.

A run holds its sandbox while its code waits for child runs, and each child needs a sandbox of
its own: with a plain semaphore, parents can take every slot and wait forever for children
that wait for those slots. Here a request says how many levels of descendants the
run may still open (`levels_below`, 0 for a run that can start no child) and is granted only
while `levels_below` slots stay free after it. Waiting requests are served deepest first
(fewest levels below), FIFO within a depth.

Why that never deadlocks: take the most recently granted run that is still open. When it was
granted, at least its `levels_below` slots stayed free, and only releases happened since. If it
waits for a child, that child (or a descendant the child waits for) asks with fewer levels
below, so it needs at most those free slots and is granted. Runs that cannot start children
never wait for a slot while holding one. So some run always makes progress.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel

from rlm_mcp.errors import SandboxError


@dataclass(order=True)
class _Request:
    levels_below: int
    seq: int
    granted: anyio.Event = field(default_factory=anyio.Event, compare=False)


class SandboxSlots:
    """A counting limiter whose grants keep room for the requester's descendants."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._waiting: list[_Request] = []
        self._seq = itertools.count()

    @property
    def free(self) -> int:
        return self._free

    def _fits(self, levels_below: int) -> bool:
        return self._free >= levels_below + 1

    def _grant_waiters(self) -> None:
        # Sorted by (levels_below, seq): once the head does not fit, no later request fits.
        self._waiting.sort()
        while self._waiting and self._fits(self._waiting[0].levels_below):
            request = self._waiting.pop(0)
            self._free -= 1
            request.granted.set()

    async def acquire(self, levels_below: int) -> None:
        levels_below = max(levels_below, 0)
        if levels_below + 1 > self.capacity:
            raise SandboxError(
                f"This run may nest {levels_below + 1} sandboxes (max_depth), but only {self.capacity} may run "
                "at once (RLM_MCP_MAX_SANDBOXES), so its deepest rlm_query could never start.",
                "Lower max_depth or raise RLM_MCP_MAX_SANDBOXES.",
            )
        # Served at once only if no waiter of the same or a deeper level is ahead of it.
        if self._fits(levels_below) and not any(w.levels_below <= levels_below for w in self._waiting):
            self._free -= 1
            await anyio.lowlevel.checkpoint()
            return
        request = _Request(levels_below, next(self._seq))
        self._waiting.append(request)
        try:
            await request.granted.wait()
        except BaseException:
            if request.granted.is_set():
                self.release()  # granted while being cancelled: give it back
            else:
                self._waiting.remove(request)
            raise

    def release(self) -> None:
        self._free += 1
        self._grant_waiters()

    @contextlib.asynccontextmanager
    async def hold(self, levels_below: int) -> AsyncIterator[None]:
        await self.acquire(levels_below)
        try:
            yield
        finally:
            self.release()
