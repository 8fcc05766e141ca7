"""`wait_until`, the suite's way to wait for a condition: its failure names what never happened
and, when asked, the state found at the deadline."""

from __future__ import annotations

import pytest

from rlm_mcp.testing.waiting import wait_until


@pytest.mark.anyio
async def test_a_condition_that_becomes_true_returns() -> None:
    polls: list[int] = []

    def third_poll() -> bool:
        polls.append(1)
        return len(polls) >= 3

    await wait_until(third_poll, within_s=30, what="the third poll")
    assert len(polls) == 3


@pytest.mark.anyio
async def test_a_condition_never_true_fails_with_what_was_found_at_the_deadline() -> None:
    left = ["sandbox-a: running (Up 2 minutes)"]
    with pytest.raises(AssertionError) as raised:
        await wait_until(lambda: False, within_s=0.05, what="the sandbox removed", found=lambda: left)
    assert str(raised.value) == (
        "the sandbox removed did not happen within 0.05 s; found: ['sandbox-a: running (Up 2 minutes)']"
    )


@pytest.mark.anyio
async def test_without_found_the_failure_names_only_what_never_happened() -> None:
    async def never() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"^the run ended did not happen within 0.05 s$"):
        await wait_until(never, within_s=0.05, what="the run ended")
