"""`rlm_mcp.ticks`: periodic tasks wait until the same instants of the wall clock, so those with
the same period (or a multiple of another's) come due together: one wake-up between them."""

from __future__ import annotations

import math

import pytest

from rlm_mcp.ticks import SLACK_S, until_tick


@pytest.mark.parametrize("clock", [1_800_000_000.0, 1_800_000_003.25, 1_800_000_004.9995, 1_800_000_005.0])
@pytest.mark.parametrize("period", [0.2, 1.0, 5.0, 10.0])
def test_a_wait_ends_just_past_the_next_multiple_of_its_period(clock: float, period: float) -> None:
    wait = until_tick(period, clock=clock)
    assert 0 < wait <= period + SLACK_S  # at least once a period
    due = clock + wait - SLACK_S
    assert math.isclose(due / period, round(due / period), abs_tol=1e-6)


def test_tasks_with_periods_of_one_and_five_seconds_come_due_together() -> None:
    clock = 1_800_000_002.4
    assert math.isclose(clock + until_tick(5.0, clock=clock), 1_800_000_005.0 + SLACK_S)
    later = 1_800_000_004.4  # the once-a-second task's third wait ends at the same instant
    assert math.isclose(later + until_tick(1.0, clock=later), 1_800_000_005.0 + SLACK_S)
