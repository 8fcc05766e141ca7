"""Waiting for a condition in tests, instead of sleeping and hoping it happened."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import anyio

POLL_S = 0.02


async def wait_until(
    condition: Callable[[], object | Awaitable[object]],
    *,
    within_s: float = 30.0,
    what: str = "the condition",
    found: Callable[[], object] | None = None,
    poll_s: float = POLL_S,
) -> None:
    """Return once `condition()` is true (awaited when it is a coroutine function); fail the test
    after a generous `within_s` deadline (a hang becomes a failure that names what never
    happened, never a timing assertion). `found`: what the failure also says, read at the deadline
    (the state that kept the condition false). `poll_s`: longer for a condition that costs
    something to ask (a Docker listing)."""
    with anyio.move_on_after(within_s):
        # Polling on purpose: the conditions (a thread's state, a container list) have no event.
        while True:
            outcome = condition()
            if inspect.isawaitable(outcome):
                outcome = await outcome
            if outcome:
                return
            await anyio.sleep(poll_s)
    seen = "" if found is None else f"; found: {found()}"
    raise AssertionError(f"{what} did not happen within {within_s:g} s{seen}")
