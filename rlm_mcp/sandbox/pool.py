"""The warm pool: started, kernel-ready containers waiting for a run (each used once)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable

import anyio

from rlm_mcp.ports.kernel import KernelChannel

log = logging.getLogger("rlm_mcp.sandbox")


class WarmPool:
    """Keeps `size` ready containers; `take()` never waits for Docker when one is there."""

    def __init__(
        self,
        size: int,
        start: Callable[[], Awaitable[KernelChannel]],
        discard: Callable[[KernelChannel], Awaitable[None]],
        *,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`quiet`: awaited before each start while the pool still holds a container (see
        rlm_mcp.sandbox.quiet); an empty pool refills at once."""
        self.size = size
        self._quiet = quiet
        self._start = start
        self._discard = discard
        self._ready: deque[KernelChannel] = deque()
        self._wake = anyio.Event()
        self._failures = 0
        self._dead: list[KernelChannel] = []

    def __len__(self) -> int:
        return len(self._ready)

    @property
    def full(self) -> bool:
        """Whether the pool holds its `size`: the one rule for what it keeps (`offer`, the refill)."""
        return len(self._ready) >= self.size

    def take(self) -> KernelChannel | None:
        """A ready container, or None. Dead ones are dropped (their cleanup runs in refill)."""
        while self._ready:
            container = self._ready.popleft()
            self._wake.set()
            if not container.eof and not container.closed:
                return container
            self._dead.append(container)
        return None

    def offer(self, container: KernelChannel) -> bool:
        """Keep an unused, ready container that was started outside the refill; False when the
        pool is full (the caller discards it)."""
        if self.full or container.eof or container.closed:
            return False
        self._ready.append(container)
        return True

    async def refill_forever(self) -> None:
        """Background task: top the pool up after every take, backing off after failures."""
        while True:
            while self._dead:
                await self._discard(self._dead.pop())
            while not self.full:
                if self._ready and self._quiet is not None:
                    await self._quiet()
                    if self.full:
                        break
                try:
                    container = await self._start()
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as exc:
                    self._failures += 1
                    log.warning("warm pool: could not start a sandbox (%s)", exc)
                    await anyio.sleep(min(30.0, 0.5 * 2 ** min(self._failures, 6)))
                    continue
                self._failures = 0
                if self.full:
                    # Filled while this one started: a container started elsewhere was offered
                    # (the first kernel a worker boots to learn whether the image can snapshot).
                    await self._discard(container)
                    break
                self._ready.append(container)
            self._wake = anyio.Event()
            await self._wake.wait()

    async def drain(self) -> None:
        """Discard every pooled container (shutdown)."""
        with anyio.CancelScope(shield=True):
            while self._ready:
                await self._discard(self._ready.popleft())
            while self._dead:
                await self._discard(self._dead.pop())
