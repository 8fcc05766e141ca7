"""When a front reads a followed run's row (`QueueFront._watch`, `Wakeups.heard_within`), on the
in-memory queue: a run heard of nothing for a poll interval is read again while the listener
heard nothing either (an announcement may have been lost), and is not while the listener hears
other runs (its session is alive, so this run's announcements would have come); a burst of runs
reads the live workers' count once."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import anyio
import pytest

from rlm_mcp.ports.queue import RunRow
from rlm_mcp.ports.runs import LiveSummary, RunRecord, encode_final, encode_live
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.testing.memory_queue import MemoryRunQueue
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_queue_team import summary

pytestmark = pytest.mark.anyio


class Counted:
    """The queue's row reads and the follower's waits, counted; `waits_reached(n)` is set once
    the follower has waited `n` times."""

    def __init__(self, queue: MemoryRunQueue, wakeups: Wakeups, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.waits = 0
        self.within: list[float] = []  # each wait's own timeout
        self._targets: list[tuple[int, anyio.Event]] = []
        real_read, real_wait = queue.read, wakeups.wait

        async def read(run_id: str) -> RunRow | None:
            self.reads += 1
            return await real_read(run_id)

        async def wait(run_id: str, within_s: float) -> tuple[bool, LiveSummary | RunRecord | None]:
            self.waits += 1
            self.within.append(within_s)
            for n, event in self._targets:
                if self.waits >= n:
                    event.set()
            return await real_wait(run_id, within_s)

        monkeypatch.setattr(queue, "read", read)
        monkeypatch.setattr(wakeups, "wait", wait)

    async def waits_reached(self, n: int) -> None:
        event = anyio.Event()
        self._targets.append((n, event))
        if self.waits >= n:
            event.set()
        with anyio.fail_after(30):
            await event.wait()


def _listeners(queue: MemoryRunQueue, monkeypatch: pytest.MonkeyPatch) -> list[Callable[[str], None]]:
    """The note callbacks the front's listener hands the queue, as it hands them (to call by hand)."""
    heard: list[Callable[[str], None]] = []
    real_listen = queue.listen_runs

    async def listen_runs(on_note: Callable[[str], None], *, on_connect: Callable[[], object]) -> None:
        heard.append(on_note)
        await real_listen(on_note, on_connect=on_connect)

    monkeypatch.setattr(queue, "listen_runs", listen_runs)
    return heard


async def test_a_quiet_run_is_read_again_while_the_listener_hears_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(queue_poll_s=0.01).queue
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue)
    counted = Counted(queue, wakeups, monkeypatch)
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id="run_quiet00000000001")
        worker = await queue.register_worker("owner-quiet", 4)
        row = await queue.claim(worker, 8, 8)
        assert row is not None
        log = await queue.reopen(row.run_id, attempt=row.attempt)
        # Written without its announcement (as if the NOTIFY was lost): only a read shows it.
        assert await log.flush(summary=summary(row.run_id, status="running", iterations=3))
        with anyio.fail_after(30):
            while run.progress.iterations != 3:
                await run.wait_change(1.0)
        assert counted.reads >= 1


async def test_a_running_run_waits_with_no_timer_and_is_read_again_while_the_listener_hears_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once its claim is heard, a run's watcher waits for news with no timer of its own (a queued
    one looks every poll interval, for the no-worker notice); an announcement lost while the
    listener hears nothing at all is still found: the process's one silence timer
    (`Wakeups.watch_silence`) wakes it to read the row."""
    settings = make_settings(queue_poll_s=0.01).queue
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue)
    counted = Counted(queue, wakeups, monkeypatch)
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id="run_quiet00000000003")
        worker = await queue.register_worker("owner-quiet", 4)
        row = await queue.claim(worker, 8, 8)
        assert row is not None
        log = await queue.reopen(row.run_id, attempt=row.attempt)
        assert await log.flush(summary=summary(row.run_id, status="running", iterations=1), announce=True)
        with anyio.fail_after(30):
            while run.progress.status != "running":
                await run.wait_change(1.0)
        # Written without its announcement (as if the NOTIFY was lost): only a read shows it.
        assert await log.flush(summary=summary(row.run_id, status="running", iterations=3))
        with anyio.fail_after(30):
            while run.progress.iterations != 3:
                await run.wait_change(1.0)
        assert counted.within[-1] == math.inf  # it waited for news, no timer of its own


async def test_a_quiet_run_is_not_read_while_the_listener_hears_other_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(queue_poll_s=0.01).queue
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue, clock=lambda: 0.0)  # what was heard was heard just now
    counted = Counted(queue, wakeups, monkeypatch)
    heard = _listeners(queue, monkeypatch)
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id="run_quiet00000000002")
        await counted.waits_reached(1)
        assert heard
        heard[0](encode_live("run_another000000001", LiveSummary(iterations=1)))  # another run, not followed here
        before = counted.reads
        await counted.waits_reached(counted.waits + 5)  # five poll intervals with nothing for this run
        assert counted.reads == before
        assert run.progress.status == "queued"


async def test_a_run_ends_from_the_final_record_its_announcement_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(queue_poll_s=60.0).queue  # no timed look at the row within the test
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue)
    counted = Counted(queue, wakeups, monkeypatch)
    heard = _listeners(queue, monkeypatch)
    run_id = "run_final00000000001"
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id=run_id)
        await counted.waits_reached(1)
        before = counted.reads
        final = summary(run_id, status="running", iterations=2).ended("cancelled", "stopped by its caller")
        heard[0](encode_final(run_id, json.dumps(final.to_stored())))
        with anyio.fail_after(30):
            await run.done.wait()
        # The end, its status and its notice came with the wake-up: the row was not read.
        assert counted.reads == before
        assert run.progress.status == "cancelled" and run.progress.iterations == 2
        assert run.notice is not None and run.notice.render() == "stopped by its caller"


async def test_a_burst_of_runs_reads_the_live_workers_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs of a burst that find the live workers' count due while it is read wait for that
    read: one statement for them all, and each says what it found (no worker alive)."""
    settings = make_settings(queue_poll_s=60.0).queue  # the count is due once within the test
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue)
    counted = Counted(queue, wakeups, monkeypatch)
    asked, answer = anyio.Event(), anyio.Event()
    reads = 0
    real_live_workers = queue.live_workers

    async def live_workers() -> int:
        nonlocal reads
        reads += 1
        asked.set()
        await answer.wait()
        return await real_live_workers()

    monkeypatch.setattr(queue, "live_workers", live_workers)
    async with QueueFront(settings, queue, wakeups) as front:
        runs = [
            await front.start(summary("run_unused0000000000").request, None, run_id=f"run_burst{i:011d}")
            for i in range(5)
        ]
        with anyio.fail_after(30):
            await asked.wait()
        answer.set()
        await counted.waits_reached(len(runs))  # each run past its notice, waiting for news
        assert reads == 1
        assert all(run.waiting is not None and "no worker" in run.waiting.render() for run in runs)
