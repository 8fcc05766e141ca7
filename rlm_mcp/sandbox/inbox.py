"""Hand-over from a channel's reader (a thread, or event-loop callbacks) to the session, for any
backend's channel.

`ByteBudget` bounds the bytes a reader has parsed but the loop has not consumed (back-pressure:
the kernel blocks writing instead of the host growing); `Inbox` is the loop-side queue.
"""

from __future__ import annotations

import asyncio
import collections
import threading

from rlm_mcp.ports.kernel import ChannelEvent


class ByteBudget:
    """Bounds the bytes parsed by the reader but not yet consumed (always lets one through)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._cond = threading.Condition()
        self._closed = False

    def acquire(self, n: int) -> bool:
        """Wait until `n` more bytes fit (or nothing is held), then take them; False once closed."""
        with self._cond:
            while self._used and self._used + n > self._limit and not self._closed:
                self._cond.wait(0.5)
            if self._closed:
                return False
            self._used += n
            return True

    def try_acquire(self, n: int) -> bool:
        """`acquire` without the wait: False when `n` more bytes do not fit now (or closed)."""
        with self._cond:
            if self._closed or (self._used and self._used + n > self._limit):
                return False
            self._used += n
            return True

    def charge(self, n: int) -> None:
        """Count `n` bytes that exist already (a parsed frame), fitting or not: later acquires wait."""
        with self._cond:
            self._used += n

    def release(self, n: int) -> None:
        with self._cond:
            self._used = max(0, self._used - n)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Inbox:
    """Events from the reader thread, consumed on the event loop (put and get both run there).

    Not an anyio memory stream: its receive() yields to the loop once before it waits, an
    extra event-loop round for every frame; a waiting get() here costs only the wake-up.
    """

    def __init__(self) -> None:
        self._items: collections.deque[ChannelEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, event: ChannelEvent) -> None:
        self._items.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> ChannelEvent:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()
