"""Queueing read from latency: whether an endpoint's calls wait longer than they need to.

An LM call's latency follows its length (prefill of the prompt, decode of each completion
token), so a raw latency says nothing about load: a 2,000-token answer is slow on an idle
server. What queueing adds is latency that calls *of the same size* did not have before. So each
answered call is compared with the fastest recent call of about its size at this endpoint and
model: the size is a cell of (completion tokens, prompt tokens) on log scales (completion tokens
in steps of √2, prompt tokens in steps of 2), and a cell's baseline is the lowest latency it has
seen: a faster call sets it, a slower one never moves it up, so a queue that persists is never
learned as the normal (the flaw of a baseline that drifts towards what it sees). Only at the
floor (one call in flight, which queues behind nothing of ours) is a slow round read as the
endpoint itself being slower (a bigger model, other users' load): the baselines are rebased by
that round's median and the limit may grow again.

The ratio latency ÷ baseline is ≈ 1 while calls are served at once; behind a queue that serves
c at a time with n in flight it grows to about n / c. The rounds give hysteresis, as the 429 cut
does: only calls sent after the last decision count, and a decision needs `ROUND_MIN` of them (up
to the limit's worth, at most `ROUND_MAX`). On the round's median (one slow call is noise):
- median ≥ the cut ratio: the limit is cut in proportion, × max(½, clear ÷ median), which under a
  queue brings the calls in flight to about the endpoint's capacity × the clear ratio;
- median ≤ the clear ratio (1 + a third of the way to the cut ratio): the queue has cleared and
  the limit may grow again (lm/throttle.py's additive growth);
- in between: hold, neither cut nor grow.
The clear ratio sits below the cut ratio so that a limit that was just cut does not grow straight
back into the queue (and noise around one ratio cannot saw the limit).

No allocation beyond the round's list; a few float operations per answered call.
"""

from __future__ import annotations

import math
import statistics

ROUND_MIN, ROUND_MAX = 4, 16  # calls per decision
MAX_CELLS = 512  # a bound on memory: sizes beyond it share the last cells


def cell(prompt_tokens: int, completion_tokens: int) -> int:
    """The size class of a call: completion tokens in √2 steps, prompt tokens in steps of 2."""
    c = int(2 * math.log2(completion_tokens + 1))
    p = int(math.log2(prompt_tokens + 1))
    return min(c * 32 + p, MAX_CELLS - 1)


class QueueingSignal:
    """One endpoint and model's latency baselines and the current round of ratios."""

    def __init__(self, cut_ratio: float) -> None:
        if cut_ratio <= 1:
            raise ValueError("the cut ratio must be above 1")
        self.cut_ratio = cut_ratio
        self.clear_ratio = 1 + (cut_ratio - 1) / 3
        self.last_median: float | None = None  # of the last decided round (the viewer shows it)
        self._base: dict[int, float] = {}
        self._round: list[float] = []
        self._since = -math.inf  # calls sent before this (monotonic) belong to an older round

    def restart(self, now: float) -> None:
        """The limit changed for another reason (a 429): the calls in flight are of the old limit."""
        self._since = now
        self._round.clear()

    def observe(
        self, latency_s: float, prompt_tokens: int, completion_tokens: int, now: float, limit: int
    ) -> float | None:
        """One call answered `latency_s` after it was sent (`now`: monotonic) under a limit of
        `limit` calls in flight. The median ratio of the round it completes, or None while the
        round is open."""
        key = cell(prompt_tokens, completion_tokens)
        base = self._base.get(key)
        if base is None or latency_s < base:
            base = self._base[key] = max(latency_s, 1e-6)
        if now - latency_s < self._since:
            return None  # sent under the old limit: its latency says nothing about the new one
        self._round.append(latency_s / base)
        if len(self._round) < min(ROUND_MAX, max(ROUND_MIN, limit)):
            return None
        median = statistics.median(self._round)
        self._round.clear()
        self._since = now
        self.last_median = median
        if limit <= 1 and median > self.clear_ratio:
            # Nothing of ours queues at the floor: the endpoint itself is slower now.
            for k in self._base:
                self._base[k] *= median
            return 1.0
        return median

    def factor(self, median: float) -> float:
        """What a cut multiplies the limit by for a round with this median."""
        return max(0.5, self.clear_ratio / median)
