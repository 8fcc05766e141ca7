"""A front's wake-ups (`service/queue/wakeups.py`), without a database: a wake-up that arrives
while the follower is busy is kept for its next wait, the latest one wins, and a wake-up that
carries no summary means "read the row"."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlm_mcp.ports.runs import LiveSummary
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.wakeups import READ_ROW, Wakeups
from rlm_mcp.testing.memory_queue import MemoryRunQueue
from rlm_mcp.testing.settings import make_settings

pytestmark = pytest.mark.anyio


async def test_a_wake_up_while_the_follower_is_busy_is_kept_and_the_latest_wins() -> None:
    wakeups = Wakeups(MemoryRunQueue(queue_rules(make_settings().queue)))
    wakeups.wake("run_a", LiveSummary(iterations=1))  # not followed here: nothing is kept
    assert await wakeups.wait("run_a", 0) == (False, READ_ROW)

    await wakeups.follow("run_b")
    wakeups.wake("run_b", LiveSummary(iterations=1))  # the follower is reading its row meanwhile
    wakeups.wake("run_b", LiveSummary(iterations=2))
    assert await wakeups.wait("run_b", 60) == (True, LiveSummary(iterations=2))
    assert await wakeups.wait("run_b", 0) == (False, READ_ROW)  # taken once

    wakeups.wake("run_b", LiveSummary(iterations=3))
    wakeups.wake("run_b")  # a final status, a requeue: only the row tells
    assert await wakeups.wait("run_b", 60) == (True, READ_ROW)

    wakeups.forget("run_b")
    wakeups.wake("run_b", LiveSummary(iterations=4))
    assert await wakeups.wait("run_b", 0) == (False, READ_ROW)


async def test_the_listener_decodes_only_the_announcements_of_runs_followed_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlm_mcp.ports.runs import RunRecord, decode_announcement, encode_live
    from rlm_mcp.service.queue import wakeups as wakeups_module

    decoded: list[str] = []
    real = decode_announcement

    def counting(payload: str) -> tuple[str, LiveSummary | RunRecord | None]:
        decoded.append(payload.partition(" ")[0])
        return real(payload)

    monkeypatch.setattr(wakeups_module, "decode_announcement", counting)
    queue = MemoryRunQueue(queue_rules(make_settings().queue))
    wakeups = Wakeups(queue)
    heard: list[Callable[[str], None]] = []

    async def listen_runs(on_note: Callable[[str], None], *, on_connect: object) -> None:
        heard.append(on_note)

    monkeypatch.setattr(queue, "listen_runs", listen_runs)
    await wakeups.listen_forever()
    (on_note,) = heard
    await wakeups.follow("run_b")
    on_note(encode_live("run_a", LiveSummary(iterations=1)))  # another replica's run
    on_note(encode_live("run_b", LiveSummary(iterations=2)))
    on_note("run_c")
    assert decoded == ["run_b"]
    assert await wakeups.wait("run_b", 60) == (True, LiveSummary(iterations=2))
