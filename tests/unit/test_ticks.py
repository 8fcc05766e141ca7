"""`rlm_mcp.ticks`: a process's periodic tasks wait until the same instants of the event loop's
clock, so those with the same period (or a multiple of another's) come due together: one wake-up
between them; shifted by a phase of the process's own, so a host's processes do not all wake at once."""

from __future__ import annotations

import math

import pytest

from rlm_mcp.service.queue.publishing import next_publish_at
from rlm_mcp.ticks import PHASE_S, SLACK_S, next_tick, until_tick


def _on_tick(instant: float, period: float) -> bool:
    ticks = (instant - SLACK_S - PHASE_S) / period
    return math.isclose(ticks, round(ticks), abs_tol=1e-6)


@pytest.mark.parametrize("clock", [1000.0, 1003.25, 1004.9995, 1005.0])
@pytest.mark.parametrize("period", [0.2, 1.0, 5.0, 10.0])
def test_a_wait_ends_just_past_the_next_tick_of_its_period(clock: float, period: float) -> None:
    for now in (clock, clock + PHASE_S):  # on and off this process's phase (it comes from the pid)
        wait = until_tick(period, clock=now)
        assert 0 < wait <= period + SLACK_S  # at least once a period
        assert _on_tick(now + wait, period)


def test_tasks_with_periods_of_one_and_five_seconds_come_due_together() -> None:
    clock = 1002.4
    five = clock + until_tick(5.0, clock=clock)
    one = clock
    for _ in range(10):  # the once-a-second task reaches the same instant
        one += until_tick(1.0, clock=one)
        if one >= five - 1e-9:
            break
    assert math.isclose(one, five)


def test_the_phase_is_within_a_second() -> None:
    assert 0.0 <= PHASE_S < 1.0


@pytest.mark.parametrize("interval", [0.1, 1.0, 2.5])
def test_runs_published_within_one_interval_publish_next_at_the_same_tick(interval: float) -> None:
    """A worker's live summaries (`service/queue/publishing.py`): the next one of each run waits
    for the first tick of the interval at least half an interval after its last one, so runs
    whose last ones fell in the same interval publish together (the log writer then takes them
    in one statement); once on the ticks, one per interval."""
    tick = 1000.0 + PHASE_S + SLACK_S
    times = [tick + interval * f for f in (0.001, 0.2, 0.49)]
    nexts = {next_publish_at(t, interval) for t in times}
    assert len(nexts) == 1
    (at,) = nexts
    assert _on_tick(at, interval) and math.isclose(at, tick + interval)
    for t in (tick + interval * 0.7, 1234.567):  # never sooner than half an interval, never later than 1.5
        assert t + interval / 2 < next_publish_at(t, interval) <= t + interval * 1.5 + SLACK_S
    assert next_publish_at(-math.inf, interval) == -math.inf and next_publish_at(tick, 0.0) == -math.inf  # at once
    # The first one at the time given (an unfollowed run's: its interval's first tick), unless there is no interval.
    assert next_publish_at(-math.inf, interval, first=tick) == tick
    assert next_publish_at(-math.inf, 0.0, first=tick) == -math.inf
    assert math.isclose(next_tick(interval, tick), tick + interval)
