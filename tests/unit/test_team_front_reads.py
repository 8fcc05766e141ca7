"""When a front reads a followed run's row (`QueueFront`, `Wakeups.heard_within`), on the
in-memory queue: no task follows a run (what its announcements carry is applied in the
listener's callback; a task is started only to read a row); a run heard of nothing is read again
while the listener heard nothing either and its session does not answer a round trip (an
announcement may have been lost), and is not while the listener hears other runs or its session
answers (so this run's announcements would have come), but is when a caller asks about it
(`find`: its later unfollowed live summaries are in the row alone); a burst of queued runs reads
the live workers' count once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from rlm_mcp.engine import RunPhase
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.queue import RunRow
from rlm_mcp.ports.runs import LiveSummary, Notice, encode_final, encode_live
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.testing.memory_queue import MemoryRunQueue
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_queue_team import summary

pytestmark = pytest.mark.anyio


class Counted:
    """The queue's row reads and live-worker reads, counted; `workers_read(n)` returns once the
    count has been read `n` times (one read per poll interval while a run is queued)."""

    def __init__(self, queue: MemoryRunQueue, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.worker_reads = 0
        self._targets: list[tuple[int, anyio.Event]] = []
        real_read, real_live = queue.read, queue.live_workers

        async def read(run_id: str) -> RunRow | None:
            self.reads += 1
            return await real_read(run_id)

        async def live_workers() -> int:
            self.worker_reads += 1
            for n, event in self._targets:
                if self.worker_reads >= n:
                    event.set()
            return await real_live()

        monkeypatch.setattr(queue, "read", read)
        monkeypatch.setattr(queue, "live_workers", live_workers)

    async def workers_read(self, n: int) -> None:
        event = anyio.Event()
        self._targets.append((n, event))
        if self.worker_reads >= n:
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


def _tasks_started(front: QueueFront, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tasks the front starts from now on (its task group's `start_soon`)."""
    started: list[str] = []
    tg = front._tg
    assert tg is not None
    real = tg.start_soon

    def start_soon(func: Callable[..., Any], *args: Any, name: object = None) -> None:
        started.append(getattr(func, "__name__", repr(func)))
        real(func, *args, name=name)

    monkeypatch.setattr(tg, "start_soon", start_soon)
    return started


def _pings(queue: MemoryRunQueue, monkeypatch: pytest.MonkeyPatch, *, answered: bool) -> list[int]:
    """The listener's session asked for a round trip (`listener_alive`), answering `answered`;
    the list grows by one per ask."""
    asked: list[int] = []

    async def listener_alive(within_s: float) -> bool:
        asked.append(len(asked))
        return answered

    monkeypatch.setattr(queue, "listener_alive", listener_alive)
    return asked


@dataclass
class QuietRun:
    front: QueueFront
    run: ActiveRun
    counted: Counted
    asked: list[int]


@asynccontextmanager
async def _quiet_run(monkeypatch: pytest.MonkeyPatch, run_id: str, *, answered: bool) -> AsyncIterator[QuietRun]:
    """A followed run whose worker wrote a live summary (3 iterations) without its announcement,
    on a front whose silence timer fires every 10 ms and whose pings are `answered` or not."""
    settings = make_settings(queue_poll_s=0.01).queue
    queue = MemoryRunQueue(queue_rules(settings))
    counted = Counted(queue, monkeypatch)
    asked = _pings(queue, monkeypatch, answered=answered)
    async with QueueFront(settings, queue, Wakeups(queue)) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id=run_id)
        worker = await queue.register_worker("owner-quiet", 4)
        row = await queue.claim(worker, 8, 8)
        assert row is not None
        log = await queue.reopen(row.run_id, attempt=row.attempt)
        assert await log.flush(summary=summary(row.run_id, status="running", iterations=3))
        yield QuietRun(front, run, counted, asked)


async def test_a_quiet_run_is_read_again_while_the_listener_hears_nothing_and_its_session_is_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The summary was written without its announcement (as if the NOTIFY was lost): only a read shows it.
    async with _quiet_run(monkeypatch, "run_quiet00000000001", answered=False) as quiet:
        with anyio.fail_after(30):
            while quiet.run.progress.iterations != 3:
                await quiet.run.wait_change(1.0)
        assert quiet.counted.reads >= 1 and quiet.asked


async def test_a_quiet_run_is_not_read_while_the_listeners_session_answers_but_is_when_asked_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live summary written without its announcement (an unfollowed run's later ones): the
    silence timer asks the session for a round trip each interval, which answers, so nobody
    reads the row; a caller asking about the run (`find`, as `rlm_status` does) reads it."""
    async with _quiet_run(monkeypatch, "run_quiet00000000002", answered=True) as quiet:
        reads = quiet.counted.reads
        with anyio.fail_after(30):
            while len(quiet.asked) < 5:  # five quiet intervals, each answered
                await anyio.sleep(0.01)
        assert quiet.counted.reads == reads and quiet.run.progress.iterations == 0
        found = await quiet.front.find(quiet.run.run_id, owner=LOCAL_OWNER)
        assert found is quiet.run and quiet.run.progress.iterations == 3 and quiet.counted.reads == reads + 1


async def test_no_task_follows_a_run_whose_news_comes_with_its_announcements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its claim, its live summaries and its final record, heard with their announcements, are
    applied by the listener's callback: no task is started for the run and its row is never read;
    an announcement that carries nothing starts one task, which reads the row."""
    settings = make_settings(queue_poll_s=60.0).queue  # no silence within the test
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue, clock=lambda: 0.0)  # what was heard was heard just now
    counted = Counted(queue, monkeypatch)
    heard = _listeners(queue, monkeypatch)
    run_id = "run_notask0000000001"
    async with QueueFront(settings, queue, wakeups) as front:
        await anyio.wait_all_tasks_blocked()  # the listener connected (its connect tells every run to read)
        started = _tasks_started(front, monkeypatch)
        run = await front.start(summary("run_unused0000000000").request, None, run_id=run_id)
        await anyio.wait_all_tasks_blocked()
        heard[0](encode_live(run_id, LiveSummary(status="running", iterations=1)))
        assert run.progress.status == "running" and run.progress.iterations == 1
        heard[0](encode_live(run_id, LiveSummary(status="running", iterations=2)))
        assert run.progress.iterations == 2
        assert started == [] and counted.reads == 0

        heard[0](run_id)  # only the row tells
        await anyio.wait_all_tasks_blocked()
        assert started == ["_read"] and counted.reads == 1

        final = summary(run_id, status="running", iterations=3).ended("completed", "done")
        heard[0](encode_final(run_id, json.dumps(final.to_stored())))
        assert run.done.is_set()
        assert str(run.progress.status) == "completed"
        assert started == ["_read"] and counted.reads == 1
        heard[0](encode_live(run_id, LiveSummary(status="running", iterations=9)))  # let go: not applied
        assert run.progress.iterations == 3


async def test_what_is_heard_while_the_row_is_read_is_taken_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary heard while the run's row is being read is applied once the read is done (the
    latest one), and a "read the row" heard then reads it again: nothing heard meanwhile is lost."""
    settings = make_settings(queue_poll_s=60.0).queue
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue, clock=lambda: 0.0)
    heard = _listeners(queue, monkeypatch)
    run_id = "run_busyread00000001"
    reading, go_on = anyio.Event(), anyio.Event()
    reads = 0
    real_read = queue.read

    async def read(rid: str) -> RunRow | None:
        nonlocal reads
        reads += 1
        reading.set()
        await go_on.wait()
        return await real_read(rid)

    monkeypatch.setattr(queue, "read", read)
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id=run_id)
        await anyio.wait_all_tasks_blocked()
        heard[0](run_id)
        with anyio.fail_after(30):
            await reading.wait()
        heard[0](encode_live(run_id, LiveSummary(status="running", iterations=4)))
        heard[0](encode_live(run_id, LiveSummary(status="running", iterations=5)))
        assert run.progress.iterations == 0  # kept until the read is done
        go_on.set()
        await anyio.wait_all_tasks_blocked()
        assert run.progress.iterations == 5 and reads == 1

        reading, go_on = anyio.Event(), anyio.Event()
        heard[0](run_id)
        with anyio.fail_after(30):
            await reading.wait()
        heard[0](run_id)  # again while it reads: one more read after it
        go_on.set()
        await anyio.wait_all_tasks_blocked()
        assert reads == 3


async def test_a_quiet_run_is_not_read_while_the_listener_hears_other_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(queue_poll_s=0.01).queue
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue, clock=lambda: 0.0)  # what was heard was heard just now
    counted = Counted(queue, monkeypatch)
    heard = _listeners(queue, monkeypatch)
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id="run_quiet00000000002")
        await anyio.wait_all_tasks_blocked()
        assert heard
        heard[0](encode_live("run_another000000001", LiveSummary(iterations=1)))  # another run, not followed here
        before = counted.reads
        await counted.workers_read(counted.worker_reads + 5)  # five poll intervals with nothing for this run
        assert counted.reads == before
        assert run.progress.status == "queued"


async def test_a_run_ends_from_the_final_record_its_announcement_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(queue_poll_s=60.0).queue  # no timed look at the row within the test
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue)
    counted = Counted(queue, monkeypatch)
    heard = _listeners(queue, monkeypatch)
    run_id = "run_final00000000001"
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id=run_id)
        await anyio.wait_all_tasks_blocked()
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
    """The runs of a burst queued while the live workers' count is due share one read (the
    queued runs' one task): one statement for them all, and each says what it found (no worker
    alive)."""
    settings = make_settings(queue_poll_s=60.0).queue  # the count is due once within the test
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue)
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
        await anyio.wait_all_tasks_blocked()
        assert reads == 1
        assert all(run.waiting is not None and "no worker" in run.waiting.render() for run in runs)
        late = await front.start(summary("run_unused0000000000").request, None, run_id="run_burst_late00001")
        assert late.waiting is not None and reads == 1  # the count is recent: said at once


async def test_the_no_worker_notice_is_a_queued_runs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued with no live worker, a run says so; once it runs the notice is gone; queued again
    (its worker handed it back), it says so again, after the record's own notice."""
    settings = make_settings(queue_poll_s=60.0).queue  # the count, once read, stays recent
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue, clock=lambda: 0.0)
    heard = _listeners(queue, monkeypatch)
    run_id = "run_noworker00000001"
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id=run_id)
        await anyio.wait_all_tasks_blocked()
        assert "no worker" in (run.snapshot().notice or "")
        heard[0](encode_live(run_id, LiveSummary(status="running", iterations=1)))
        assert run.waiting is None and run.snapshot().notice is None
        again = Notice.of_text("queued again: its worker stopped")
        heard[0](encode_live(run_id, LiveSummary(status="queued", notice=again)))
        notice = run.snapshot().notice or ""
        assert notice.startswith("queued again") and "no worker" in notice


async def test_a_mirror_that_says_queued_reads_its_row_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Claimed, with no live summary heard yet: the mirror says queued until someone asks
    (`find`), which reads the row once and shows the run running, turn 0; a mirror of a run
    nobody here follows turn by turn reads it each time (its later live summaries are written
    without a wake-up), one followed here is answered without a read."""
    settings = make_settings(queue_poll_s=60.0).queue
    queue = MemoryRunQueue(queue_rules(settings))
    wakeups = Wakeups(queue, clock=lambda: 0.0)
    counted = Counted(queue, monkeypatch)
    run_id = "run_askedrow00000001"
    async with QueueFront(settings, queue, wakeups) as front:
        run = await front.start(summary("run_unused0000000000").request, None, run_id=run_id)
        worker = await queue.register_worker("owner-asked", 4)
        assert await queue.claim(worker, 8, 8) is not None  # no announcement: its summary says queued
        await anyio.wait_all_tasks_blocked()
        before = counted.reads
        assert run.progress.status == "queued"
        assert await front.find(run_id, owner=LOCAL_OWNER) is run
        assert counted.reads == before + 1
        snap = run.snapshot()
        assert (snap.status, snap.iterations, snap.notice, run.progress.phase) == (
            "running",
            0,
            None,
            RunPhase.STARTING,
        )
        assert await front.find(run_id, owner=LOCAL_OWNER) is run
        assert counted.reads == before + 2
        await front.follow_progress(run_id)
        assert await front.find(run_id, owner=LOCAL_OWNER) is run
        assert counted.reads == before + 2
