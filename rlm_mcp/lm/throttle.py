"""Back-pressure: how many calls may be in flight to one endpoint and model, learned from its
answers and shared by a team.

Each (endpoint, model) has a `Gate` whose limit moves by AIMD, as TCP's window does: an answer
asking for less load (429 Too Many Requests, 503 Service Unavailable) halves it (once per round:
answers to calls sent before the last cut do not cut again; never below 1); a 429 call then
waits and tries again, uncounted, until its run's deadline (a 503 is retried as before,
`RLM_MCP_LM_RETRIES` times); each answered call
adds 1/limit (one more call per limit's worth of answers), up to the ceiling,
`RLM_MCP_MAX_CONCURRENT_LM_CALLS`, which is therefore the most, not the fixed number, of a
process's calls in flight to one endpoint and model. A call waits for a place at its gate before
it takes one of the process's slots, and holds it for one attempt; a call answered "less load"
holds it through its wait too, so the next call in line is not sent into the same refusal.

In team mode the workers share their cuts through the database they already share: a cut is
published on the `ThrottleChannel` (PostgreSQL NOTIFY) as the endpoint, the model and the new
limit, and every other process cuts its own gate for that endpoint and model unless it cut within
`SHARED_CUT_HOLD_S` (it already learned the same thing). So when an endpoint refuses load every
worker backs off together, and the team's total in flight falls with it instead of staying at
workers × ceiling.

Rising latency is a second signal, off by default (`RLM_MCP_LM_QUEUEING_CUT`): with it on, each
gate reads the queueing in its answered calls' latency (lm/queueing.py: each call against the
fastest recent call of its size), cuts the limit in proportion when the calls of a round take
the cut ratio × their baseline or more, and lets it grow again only once they are back near it.
Off by default because the endpoints this project is built for (vLLM) batch what they are sent:
latency per token rises with the batch while throughput rises too, so a latency-driven cut there
trades throughput for latency the run does not ask for; it suits an endpoint that queues rather
than refuses (a hosted API, a server shared with other users). Latency cuts are not shared with
the team: every worker whose calls wait in the same queue sees the same latency and cuts on its
own, so sharing would cut each worker once for its own round and again for each peer's.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable

import anyio

from rlm_mcp.lm.queueing import QueueingSignal
from rlm_mcp.observability import metrics
from rlm_mcp.ports.throttle import ThrottleChannel

log = logging.getLogger("rlm_mcp.lm")

THROTTLE_STATUSES = frozenset({429, 503})  # answers that cut the limit
# Answers a call waits out, uncounted, within its run's deadline: 429 says "later", while a 503
# may be a server that is down, which the counted retries (RLM_MCP_LM_RETRIES) still end.
WAIT_OUT_STATUSES = frozenset({429})
# A call answered "less load" waits and tries again, not counted as a retry, until the run's
# deadline ends it; a call under no deadline (doctor's probe, the evaluator) gives up after this.
THROTTLED_SLEEP_CAP_S = 3600.0
SHARED_CUT_HOLD_S = 1.0  # a process that cut this recently ignores others' cuts of the same gate


class Gate:
    """One endpoint and model's concurrency limit and the calls waiting under it."""

    def __init__(
        self,
        endpoint: str,
        url: str,
        model: str,
        ceiling: int,
        start: float | None = None,
        *,
        queueing_cut: float = 0.0,
    ) -> None:
        self.endpoint, self.url, self.model = endpoint, url, model
        self.ceiling = max(1, ceiling)
        self.limit = float(self.ceiling) if start is None else min(float(self.ceiling), max(1.0, start))
        self.in_flight = 0
        self._waiters: deque[anyio.Event] = deque()
        self._cut_at = -math.inf  # monotonic time of the last cut
        # Read by the viewer: answers that asked for less load, cuts for them (or a peer's), and
        # cuts for queueing.
        self.throttled_answers = self.cuts = self.queueing_cuts = 0
        # The latency signal (None: off) and whether it lets the limit grow (hold or cut: no).
        self.queueing = QueueingSignal(queueing_cut) if queueing_cut > 1 else None
        self._may_grow = True
        metrics.lm_limit(endpoint, model, self.allowed)

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    def try_acquire(self) -> float | None:
        """A place at once, when one is free and nobody waits: the monotonic time it was given;
        None otherwise (then `acquire`). No coroutine for the usual case, one per LM call."""
        if self.in_flight < self.allowed and not self._waiters:
            self.in_flight += 1
            return time.monotonic()
        return None

    async def acquire(self) -> float:
        """Wait for a place; the monotonic time it was given (what `throttled` compares)."""
        given = self.try_acquire()
        if given is not None:
            return given
        ready = anyio.Event()
        self._waiters.append(ready)
        try:
            await ready.wait()
        except BaseException:
            if ready.is_set():
                self.release()  # given and cancelled at once: hand it on
            else:
                self._waiters.remove(ready)
            raise
        return time.monotonic()

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.allowed:
            self.in_flight += 1
            self._waiters.popleft().set()

    def answered(self) -> None:
        """A call was answered: one more place per limit's worth of answers, up to the ceiling
        (unless the latency signal holds it)."""
        if self.limit < self.ceiling and self._may_grow:
            before = self.allowed
            self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)
            if self.allowed != before:
                metrics.lm_limit(self.endpoint, self.model, self.allowed)
                self._wake()

    def throttled(self, status: int, sent_at: float) -> bool:
        """The endpoint asked for less load: halve the limit, unless this call was sent before the
        last cut (that cut already answered it). Whether it cut."""
        metrics.lm_throttled(self.endpoint, status)
        self.throttled_answers += 1
        if sent_at < self._cut_at or self.limit <= 1.0:  # answered by the last cut, or at the floor
            return False
        self._cut()
        return True

    def answered_in(
        self, latency_s: float, prompt_tokens: int, completion_tokens: int, now: float | None = None
    ) -> None:
        """The latency of a call answered at its first attempt (at `now`, monotonic), for the
        queueing signal (when it is on)."""
        signal = self.queueing
        if signal is None:
            return
        now = time.monotonic() if now is None else now
        median = signal.observe(latency_s, prompt_tokens, completion_tokens, now, self.allowed)
        if median is None:
            return
        if median >= signal.cut_ratio:
            self._may_grow = False
            self.queueing_cuts += 1
            metrics.lm_queueing_cut(self.endpoint)
            self._cut(signal.factor(median), f"queues its calls (latency {median:.1f}× its baseline)", now)
        else:
            self._may_grow = median <= signal.clear_ratio

    def shared_cut(self) -> None:
        """Another process cut its limit for this endpoint and model."""
        if time.monotonic() - self._cut_at >= SHARED_CUT_HOLD_S:
            self._cut()

    def _cut(self, factor: float = 0.5, why: str = "asked for less load", now: float | None = None) -> None:
        self._cut_at = time.monotonic() if now is None else now
        self.cuts += 1
        self.limit = max(1.0, self.limit * factor)
        if self.queueing is not None:
            self.queueing.restart(self._cut_at)
        metrics.lm_limit(self.endpoint, self.model, self.allowed)
        log.info("%s (%s) %s: at most %d calls in flight now", self.url, self.model, why, self.allowed)

    def state(self) -> dict[str, object]:
        """What the viewer shows of this gate (plain JSON)."""
        signal = self.queueing
        return {
            "endpoint": self.endpoint,
            "url": self.url,
            "model": self.model,
            "limit": self.allowed,
            "ceiling": self.ceiling,
            "in_flight": self.in_flight,
            "waiting": len(self._waiters),
            "throttled": self.throttled_answers,
            "cuts": self.cuts,
            "queueing_cuts": self.queueing_cuts,
            "latency_ratio": None if signal is None or signal.last_median is None else round(signal.last_median, 2),
        }


class Throttles:
    """The gates of one process, by endpoint and model, and the team channel they share."""

    def __init__(self, ceiling: int, *, queueing_cut: float = 0.0) -> None:
        self.ceiling = max(1, ceiling)
        self.queueing_cut = queueing_cut  # RLM_MCP_LM_QUEUEING_CUT; 0: latency is no signal
        self._gates: dict[tuple[str, str], Gate] = {}
        self._heard: dict[tuple[str, str], float] = {}  # limits others announced for gates not made yet
        self._channel: ThrottleChannel | None = None
        self._me = uuid.uuid4().hex[:12]  # this process, so it skips its own notes
        # A team front's view: the workers' gates as they announce them (lm/throttle_board.py).
        self.team_view: Callable[[], list[dict[str, object]]] | None = None

    @property
    def me(self) -> str:
        """This process's id on the team's channels."""
        return self._me

    @property
    def shared(self) -> bool:
        """Whether cuts are shared with a team now (`share` is running)."""
        return self._channel is not None

    def gate(self, endpoint: str, url: str, model: str) -> Gate:
        gate = self._gates.get((url, model))
        if gate is None:
            start = self._heard.pop((url, model), None)
            gate = self._gates[(url, model)] = Gate(
                endpoint, url, model, self.ceiling, start, queueing_cut=self.queueing_cut
            )
        return gate

    def states(self) -> list[dict[str, object]]:
        """Every gate's state, for the viewer."""
        return [gate.state() for gate in list(self._gates.values())]

    def view(self) -> list[dict[str, object]]:
        """What the viewer shows: the team's workers' gates where this is a team front, else this
        process's own."""
        return self.team_view() if self.team_view is not None else self.states()

    async def publish_cut(self, gate: Gate) -> None:
        """Tell the team (when there is one) that `gate` was cut. Never raises."""
        if self._channel is None:
            return
        note = json.dumps({"from": self._me, "url": gate.url, "model": gate.model, "limit": gate.allowed})
        try:
            await self._channel.publish(note)
        except Exception as exc:  # the database's trouble is never the call's
            log.info("could not share a throttle cut (%s)", type(exc).__name__)

    def on_note(self, note: str) -> None:
        try:
            data = json.loads(note)
            sender, url, model, limit = data["from"], data["url"], data["model"], float(data["limit"])
        except (ValueError, KeyError, TypeError):
            return
        if sender == self._me or not isinstance(url, str) or not isinstance(model, str):
            return
        gate = self._gates.get((url, model))
        if gate is not None:
            gate.shared_cut()
        elif len(self._heard) < 1024:  # a gate not used here yet starts where the team is
            self._heard[(url, model)] = limit

    async def share(self, channel: ThrottleChannel, *, on_connect: Callable[[], object] = lambda: None) -> None:
        """Share cuts through `channel` until cancelled (the team's processes run this)."""
        self._channel = channel
        try:
            await channel.listen(self.on_note, on_connect=on_connect)
        finally:
            self._channel = None
