"""A front's wake-ups (`service/queue/wakeups.py`), without a database: a wake-up that arrives
while the follower is busy is kept for its next wait, the latest one wins, and a wake-up that
carries no summary means "read the row"."""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio
import pytest

from rlm_mcp.ports.runs import LiveSummary, RunRecord
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
    from rlm_mcp.ports.runs import decode_announcement, encode_live
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


async def test_a_summary_heard_while_the_follower_waits_is_applied_without_waking_it() -> None:
    """`on_carried` takes a live summary or record that arrives while its follower waits, with
    nothing kept for it: the follower is woken only when `on_carried` asks (the run ended), and
    then with nothing to read; what `on_carried` declines, and what arrives while the follower is
    busy, is kept for the follower's next `wait` as before."""
    wakeups = Wakeups(MemoryRunQueue(queue_rules(make_settings().queue)))
    applied: list[tuple[str, int]] = []
    answers = {"run_b": False}

    def on_carried(run_id: str, state: LiveSummary | RunRecord) -> bool | None:
        if run_id not in answers:
            return None
        applied.append((run_id, state.iterations if isinstance(state, LiveSummary) else -1))
        return answers[run_id]

    wakeups.on_carried = on_carried
    await wakeups.follow("run_b")
    await wakeups.follow("run_c")
    wakeups.wake("run_b", LiveSummary(iterations=1))  # not waiting yet: kept
    assert await wakeups.wait("run_b", 60) == (True, LiveSummary(iterations=1))
    assert applied == []

    async with anyio.create_task_group() as tg:
        got: list[tuple[bool, LiveSummary | RunRecord | None]] = []

        async def follower(run_id: str) -> None:
            got.append(await wakeups.wait(run_id, math.inf))

        tg.start_soon(follower, "run_b")
        tg.start_soon(follower, "run_c")
        await anyio.wait_all_tasks_blocked()
        wakeups.wake("run_b", LiveSummary(iterations=2))  # applied; the follower waits on
        wakeups.wake("run_c", LiveSummary(iterations=5))  # declined (None): kept, and woken
        await anyio.wait_all_tasks_blocked()
        assert applied == [("run_b", 2)]
        assert got == [(True, LiveSummary(iterations=5))]
        answers["run_b"] = True  # the run ended: woken, with nothing to read
        wakeups.wake("run_b", LiveSummary(iterations=3))
    assert applied == [("run_b", 2), ("run_b", 3)]
    assert got[1] == (False, READ_ROW)
    wakeups.wake("run_b")  # "read the row" is never applied: kept for the follower
    assert await wakeups.wait("run_b", 60) == (True, READ_ROW)


async def test_while_the_listener_hears_nothing_every_follower_reads_its_row_each_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`watch_silence`: one timer for the process. A poll interval in which the listener heard
    nothing wakes every follower to read its row; an interval in which it heard anything (any
    run's announcement) wakes nobody."""
    queue = MemoryRunQueue(queue_rules(make_settings().queue))
    wakeups = Wakeups(queue, clock=lambda: 100.0)  # the clock stands still: what was heard stays recent
    heard: list[Callable[[str], None]] = []

    async def listen_runs(on_note: Callable[[str], None], *, on_connect: object) -> None:
        heard.append(on_note)

    monkeypatch.setattr(queue, "listen_runs", listen_runs)
    await wakeups.listen_forever()
    await wakeups.follow("run_b")
    async with anyio.create_task_group() as tg:
        tg.start_soon(wakeups.watch_silence, 0.01)
        with anyio.fail_after(30):  # nothing heard yet: an interval wakes it
            assert await wakeups.wait("run_b", math.inf) == (True, READ_ROW)
        heard[0]("run_another000000001")  # another run's announcement: the listener is alive
        assert await wakeups.wait("run_b", 0.2) == (False, READ_ROW)  # many intervals: not woken
        tg.cancel_scope.cancel()
