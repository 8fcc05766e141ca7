"""A run's sandbox, opened beside its first root call.

The first root call sees the system prompt and the contexts' metadata, never the REPL, so the
sandbox (a pool container with the contexts loaded, a kept session's restore, a warm session's
new contexts) opens while that call is in flight: a 50 MiB load hides behind the model's
latency. The run takes the first reply only once the sandbox is open (`TurnRunner` waits here
before it counts the reply), so a run whose sandbox cannot open has not started, exactly as
before the overlap (docs/architecture.md, "Opening the sandbox beside the first call").

A run may also hand the opener a step to await before the sandbox opens (`ready`: the service
pins the run's contexts there, beside the first call instead of before it); its failure is the
opening's.

The opening starts once the first root request is on its way (`release`), not when the run
starts: its first steps (the pool's take, the contexts' frames) run on the event loop, and
scheduled first they ran ahead of the request at the loop's first yield, delaying the model's
start by a millisecond or more on a busy host (the run's critical path is the model's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from rlm_mcp.engine.session import Opened, Opening, SandboxSource


class SandboxOpener:
    """Opens one run's sandbox in a task of its own; the loop waits for it with `get`."""

    def __init__(
        self,
        source: SandboxSource,
        opening: Opening,
        *,
        after: Callable[[Opened], None],
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`after`: the run's bookkeeping once the sandbox is open (a session's counts), done in
        the opening task so it is done whenever the sandbox opened, whatever the loop did;
        `ready`: awaited before the sandbox opens (a failure there fails the opening)."""
        self._source = source
        self._ready = ready
        self._opening = opening
        self._after = after
        self._done = anyio.Event()
        self._released = anyio.Event()
        self._opened: Opened | None = None
        self.error: Exception | None = None  # why the sandbox did not open

    async def run(self, on_failure: anyio.CancelScope) -> None:
        """The opening task. A failure is kept for `get` and cancels `on_failure` (the loop's
        scope): an in-flight first call is abandoned, its reply could not be used. Waits for
        `release` first."""
        try:
            await self._released.wait()
            # One more loop round: the request's own write (aiohttp sends a body from a task of
            # its own, created after this wait was woken) goes out before the opening's steps.
            await anyio.lowlevel.checkpoint()
            if self._ready is not None:
                await self._ready()
            opened = await self._source.open(self._opening)
        except Exception as exc:
            self.error = exc
            on_failure.cancel()
        else:
            self._opened = opened
            self._after(opened)
        finally:
            self._done.set()

    def release(self) -> None:
        """Let the opening start: the first root request is being sent (or the loop ended
        without one, or the sandbox is wanted). Idempotent."""
        self._released.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def settled(self) -> None:
        """Wait until the opening has ended, opened or failed (released now if it was not)."""
        self.release()
        await self._done.wait()

    async def get(self) -> Opened:
        """The open sandbox (waiting for it); the opening's error when it failed. Open already
        (the usual case: it opened during the first call): no loop round, as waiting on a set
        event takes one, and the run's first reply is waiting."""
        self.release()
        if not self._done.is_set():
            await self._done.wait()
        if self.error is not None:
            raise self.error
        if self._opened is None:  # the opening task was cancelled: so is whoever waits here
            await anyio.lowlevel.checkpoint()
            raise RuntimeError("the sandbox opening was cancelled")
        return self._opened


__all__ = ["SandboxOpener"]
