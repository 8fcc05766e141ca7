"""A team's viewer shows its workers' limits: a worker announces its gates on PostgreSQL NOTIFY
(`rlm_lm_throttle_state`), a front's board keeps each worker's last note, the front's
`Throttles.view()` (what `/runs/api/throttles` serves) is the workers' gates; a worker that falls
silent is forgotten. Cut notes' listeners never see a state note (its own channel)."""

from __future__ import annotations

import functools

import anyio
import pytest

from rlm_mcp.lm.throttle import Throttles
from rlm_mcp.lm.throttle_board import ThrottleBoard, publish_states
from rlm_mcp.store.pg import Database
from rlm_mcp.store.pg.throttle import THROTTLE_STATE_CHANNEL, PgThrottleChannel
from rlm_mcp.testing.waiting import wait_until

pytestmark = pytest.mark.anyio


async def test_a_front_shows_the_workers_limits(pg_url: str) -> None:
    db = Database(pg_url, replica=False, max_size=2)
    await db.open()
    worker, front, peer = Throttles(16), Throttles(16), Throttles(16)
    gate = worker.gate("sub", "http://lm/v1", "small")
    sent = await gate.acquire()
    gate.release()
    assert gate.throttled(429, sent)  # 16 -> 8
    board = ThrottleBoard()
    front.team_view = board.states
    listening = [0]

    def connected() -> object:
        listening[0] += 1
        return None

    try:
        async with anyio.create_task_group() as tg:
            states = PgThrottleChannel(db, THROTTLE_STATE_CHANNEL)
            tg.start_soon(functools.partial(board.listen, states, on_connect=connected))
            # A peer listening for cuts: a state note must not reach it as one.
            tg.start_soon(functools.partial(peer.share, PgThrottleChannel(db), on_connect=connected))
            await wait_until(lambda: listening[0] == 2, within_s=30, what="the board and the peer listening")
            peer_gate = peer.gate("sub", "http://lm/v1", "small")
            tg.start_soon(functools.partial(publish_states, worker, states, every_s=0.05))
            await wait_until(lambda: bool(front.view()), within_s=30, what="the worker's note")
            (row,) = front.view()
            assert row["process"] == worker.me and row["limit"] == 8 and row["throttled"] == 1
            assert row["model"] == "small" and row["endpoint"] == "sub"
            assert peer_gate.allowed == 16 and peer_gate.cuts == 0
            tg.cancel_scope.cancel()
    finally:
        await db.close()
    assert front.states() == []  # the front itself called no LM
