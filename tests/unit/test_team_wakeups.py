"""A front's wake-ups (`service/queue/wakeups.py`), without a database: each wake-up of a run
followed here is handed to `on_wake` at once, in order (a summary or record it carried, or
READ_ROW: "read the row"); a run not followed here, or no longer, is not; and while the listener
hears nothing at all and its session does not answer a round trip, every followed run is told to
read its row each poll interval."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from rlm_mcp.ports.runs import LiveSummary, RunRecord
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.wakeups import READ_ROW, Wakeups
from rlm_mcp.testing.memory_queue import MemoryRunQueue
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_queue_team import summary

pytestmark = pytest.mark.anyio

Told = list[tuple[str, LiveSummary | RunRecord | None]]


def _telling(wakeups: Wakeups) -> Told:
    told: Told = []
    wakeups.on_wake = lambda run_id, state: told.append((run_id, state))
    return told


async def test_the_wake_ups_of_a_followed_run_are_handed_on_in_order() -> None:
    wakeups = Wakeups(MemoryRunQueue(queue_rules(make_settings().queue)))
    told = _telling(wakeups)
    wakeups.wake("run_a", LiveSummary(iterations=1))  # not followed here: nothing
    await wakeups.follow("run_b")
    wakeups.wake("run_b", LiveSummary(iterations=1))
    wakeups.wake("run_b")  # a final status, a requeue: only the row tells
    wakeups.wake("run_b", LiveSummary(iterations=2))
    wakeups.forget("run_b")
    wakeups.wake("run_b", LiveSummary(iterations=3))  # no longer followed
    assert told == [("run_b", LiveSummary(iterations=1)), ("run_b", READ_ROW), ("run_b", LiveSummary(iterations=2))]


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
    told = _telling(wakeups)
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
    assert told == [("run_b", LiveSummary(iterations=2))]


async def test_while_the_listener_hears_nothing_every_follower_reads_its_row_each_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`watch_silence`: one timer for the process; no listener is connected here (`listen_runs`
    replaced), so its session answers no round trip. A poll interval in which the listener heard
    nothing tells every followed run to read its row; an interval in which it heard anything (any
    run's announcement) tells nobody."""
    queue = MemoryRunQueue(queue_rules(make_settings().queue))
    wakeups = Wakeups(queue, clock=lambda: 100.0)  # the clock stands still: what was heard stays recent
    told: Told = []
    first = anyio.Event()

    def on_wake(run_id: str, state: LiveSummary | RunRecord | None) -> None:
        told.append((run_id, state))
        first.set()

    wakeups.on_wake = on_wake
    heard: list[Callable[[str], None]] = []

    async def listen_runs(on_note: Callable[[str], None], *, on_connect: object) -> None:
        heard.append(on_note)

    monkeypatch.setattr(queue, "listen_runs", listen_runs)
    await wakeups.listen_forever()
    await wakeups.follow("run_b")
    naps = 0
    real_sleep = anyio.sleep
    five = anyio.Event()

    async def counted_sleep(delay: float) -> None:
        nonlocal naps
        naps += 1
        if naps > 5:  # five whole intervals slept since the note
            five.set()
        await real_sleep(delay)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wakeups.watch_silence, 0.01)
        with anyio.fail_after(30):  # nothing heard yet: an interval tells it
            await first.wait()
        assert told == [("run_b", READ_ROW)]
        heard[0]("run_another000000001")  # another run's announcement: the listener is alive
        monkeypatch.setattr(anyio, "sleep", counted_sleep)
        with anyio.fail_after(30):
            await five.wait()
        assert told == [("run_b", READ_ROW)]  # told nothing more
        tg.cancel_scope.cancel()


async def test_a_run_followed_locally_hears_its_workers_hand_overs_and_nothing_from_the_listener(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run offered to this process's own worker (`follow_local`): no LISTEN; what the worker
    hands over in-process (`wake_local`) and the front's own READ_ROW reach `on_wake`; the
    listener's announcements of it and the silence timer's wake-all do not; once it falls back
    (`follow`), it is an ordinary followed run."""
    from rlm_mcp.ports.runs import encode_live

    queue = MemoryRunQueue(queue_rules(make_settings().queue))
    listened: list[str] = []

    async def follow_run(run_id: str) -> None:
        listened.append(run_id)

    monkeypatch.setattr(queue, "follow_run", follow_run)
    heard: list[Callable[[str], None]] = []

    async def listen_runs(on_note: Callable[[str], None], *, on_connect: object) -> None:
        heard.append(on_note)

    monkeypatch.setattr(queue, "listen_runs", listen_runs)
    wakeups = Wakeups(queue)
    told = _telling(wakeups)
    await wakeups.listen_forever()
    running = summary("run_l", status="running")
    wakeups.follow_local("run_l")
    wakeups.wake_local("run_l", running)
    wakeups.wake_local("run_x", running)  # not followed here
    heard[0](encode_live("run_l", LiveSummary(iterations=3)))  # its NOTIFY, were it heard
    wakeups.wake_all()  # the silence timer, a reconnect
    wakeups.wake("run_l")  # the front's own: a cancel reads the row
    assert listened == [] and told == [("run_l", running), ("run_l", READ_ROW)]
    await wakeups.follow("run_l")  # the fall-back
    wakeups.wake_local("run_l", running)  # no longer handed over in-process
    heard[0](encode_live("run_l", LiveSummary(iterations=4)))
    assert listened == ["run_l"]
    assert told[2:] == [("run_l", LiveSummary(iterations=4))]


async def test_a_ping_is_asked_of_a_connected_listener_only_and_ends_with_its_answer_or_its_connection() -> None:
    """`Follows.ping` (store/pg/workers.py): None while no listener is connected; else one ping
    at a time, which interrupts the listener's wait; answered (`pinged`) or not (the connection
    lost: `disconnected`), it is over either way."""
    from rlm_mcp.store.pg.workers import Follows

    follows = Follows()
    assert follows.ping() is None
    follows.connected = True
    waiting = anyio.CancelScope()  # the listener's wait, as it waits
    follows.waiting = waiting
    first = follows.ping()
    assert first is not None and follows.ping() is first and follows.ping_wanted()
    assert waiting.cancel_called and follows.interrupted
    follows.waiting = None
    follows.pinged()
    assert first.done.is_set() and first.answered and not follows.ping_wanted()
    second = follows.ping()
    assert second is not None and second is not first
    follows.disconnected()
    assert second.done.is_set() and not second.answered and not follows.ping_wanted()
    assert follows.ping() is None
