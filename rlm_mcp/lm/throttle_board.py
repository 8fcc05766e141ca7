"""What a team's viewer shows of its workers' back-pressure: each worker's gates (lm/throttle.py
`Gate.state`), as the workers last announced them.

The gates live in the workers, which call the LMs; a front, which serves the viewer, calls none.
So every process that executes runs publishes its gates' states every `EVERY_S` seconds (only
while it has any; a note of its own on a channel of its own, `ThrottleChannel` on PostgreSQL
NOTIFY, so the cut notes' listeners never see one), and every front keeps the last note of each
worker on a `ThrottleBoard`, forgetting a worker that fell silent for `STALE_S` (stopped, or
lost). A lost note costs one tick's staleness.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from rlm_mcp.lm.throttle import Throttles
from rlm_mcp.ports.throttle import ThrottleChannel
from rlm_mcp.ticks import sleep_to_tick

log = logging.getLogger("rlm_mcp.lm")

EVERY_S = 5.0  # a worker's states, at most this often (and only when they changed, or to stay fresh)
STALE_S = 30.0  # a worker not heard from for this long is no longer shown
MAX_NOTE_CHARS = 7000  # PostgreSQL's NOTIFY payload is at most 8000 bytes: gates past this are left out
MAX_WORKERS = 256


def note_of(sender: str, states: list[dict[str, object]]) -> str:
    """A worker's note: its id and as many of its gates as fit in one NOTIFY."""
    gates: list[dict[str, object]] = []
    size = 64
    for state in states:
        size += len(json.dumps(state)) + 1
        if size > MAX_NOTE_CHARS:
            break
        gates.append(state)
    return json.dumps({"from": sender, "gates": gates})


async def publish_states(throttles: Throttles, channel: ThrottleChannel, *, every_s: float = EVERY_S) -> None:
    """Announce this process's gates on `channel` until cancelled. Never raises on the channel's
    trouble (the next tick tries again)."""
    last, sent_at = "", -math.inf
    while True:
        await sleep_to_tick(every_s)  # with the process's other 5 s timers (rlm_mcp/ticks.py)
        states = throttles.states()
        if not states:
            continue
        note = note_of(throttles.me, states)
        now = time.monotonic()
        if note == last and now - sent_at < STALE_S / 2:
            continue
        try:
            await channel.publish(note)
        except Exception as exc:  # the database's trouble is never the runs'
            log.info("could not announce the LM limits (%s)", type(exc).__name__)
            continue
        last, sent_at = note, now


class ThrottleBoard:
    """The workers' gates as a front last heard them."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heard: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    def on_note(self, note: str) -> None:
        try:
            data = json.loads(note)
            sender, gates = data["from"], data["gates"]
        except (ValueError, KeyError, TypeError):
            return
        if not isinstance(sender, str) or not isinstance(gates, list):
            return
        if sender not in self._heard and len(self._heard) >= MAX_WORKERS:
            self._forget_stale()
            if len(self._heard) >= MAX_WORKERS:
                return
        self._heard[sender] = (self._clock(), [g for g in gates if isinstance(g, dict)])

    def states(self) -> list[dict[str, Any]]:
        """Every live worker's gates, each named by its worker (`process`)."""
        self._forget_stale()
        return [{**gate, "process": sender} for sender, (_, gates) in sorted(self._heard.items()) for gate in gates]

    def _forget_stale(self) -> None:
        now = self._clock()
        for sender in [s for s, (at, _) in self._heard.items() if now - at > STALE_S]:
            del self._heard[sender]

    async def listen(self, channel: ThrottleChannel, *, on_connect: Callable[[], object] = lambda: None) -> None:
        """Keep the board from `channel` until cancelled."""
        await channel.listen(self.on_note, on_connect=on_connect)
