"""The run-end hook in team mode, in process over a real PostgreSQL: a worker's run that
completes, one cancelled while it runs, one cancelled by a front while still queued, and one
whose kept session has ended (it never starts) each tell the hook exactly once, in the
process whose write ended the run, after the final record is written. (The sweeper's ends, a
lost worker's run and a run no worker took, are in test_team_sweeper.py.) No Docker: the engine
runs on the fake model and sandboxes of tests/fixtures_engine.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import Owner
from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import RunEnded, RunRecord, RunRequest
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.sessions import WorkerSessions
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.queue.worker import QueueWorker
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.pg import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.store.pg.sessions import PgSessionStore
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, submit

pytestmark = pytest.mark.anyio

ALICE = Owner("local")


class Recorder:
    """A run-end hook that keeps what it was told and the run's row as it read it then."""

    def __init__(self, queue: RunQueuePort) -> None:
        self._queue = queue
        self.told: list[RunEnded] = []
        self.stored: list[RunRecord | None] = []

    async def __call__(self, ended: RunEnded) -> None:
        row = await self._queue.read(ended.run_id)
        self.stored.append(row.summary if row is not None and row.done else None)
        self.told.append(ended)

    def once(self, run_id: str, status: str) -> RunEnded:
        told = [t for t in self.told if t.run_id == run_id]
        assert len(told) == 1
        stored = self.stored[self.told.index(told[0])]
        assert stored is not None and stored.status == status  # written (and committed) before the hook
        assert told[0].status == status and told[0].record.to_stored() == stored.to_stored()
        return told[0]


class Slots:
    """What a worker reads of its sandbox manager: its owner label and its sandbox slots (the
    engine's sandboxes here are the fake ones, opened by `FakeSandboxFactory`)."""

    owner_id = "owner-ends"
    free_slots = 4
    max_slots = 4
    reclaim = None  # set by a worker that keeps sessions
    can_snapshot = True  # its image can keep a session (the worker asks before claiming one)


@asynccontextmanager
async def team(tmp_path: Path, url: str) -> AsyncIterator[tuple[Any, PgRunQueue, Recorder, str]]:
    settings = make_settings(tmp_path, database_url=url, worker_lease_s=5.0, queue_poll_s=0.2)
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database) and isinstance(stores.runs, PgRunStore)
        queue = PgRunQueue(queue_rules(settings.queue), db)
        info = await stores.contexts.put_bytes(
            b"The magic number is 42.", name="ctx", format="text", source={"kind": "text"}, owner=ALICE
        )
        yield (settings, stores), queue, Recorder(queue), info.context_id


def request(settings: Any, context_id: str, *, session_id: str | None = None) -> RunRequest:
    return RunRequest(
        query="q", context_ids=[context_id], limits=make_limits(settings), owner=ALICE, session_id=session_id
    )


async def test_worker_and_front_ends_are_told_once_after_their_records(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as ((settings, stores), queue, recorder, ctx):
        ends = RunEnds([recorder])
        # Models handed out in claim order: the first run answers, the second waits for an hour.
        models = [FakeChatModel(root=[submit("'42'")]), FakeChatModel(root_delay_s=3600)]

        async def engine() -> RLMEngine:
            return RLMEngine(settings.engine, models.pop(0), FakeSandboxFactory())

        front = QueueFront(settings.queue, queue, Wakeups(queue), ends=ends)
        async with front:
            # Cancelled while queued (no worker yet): the front's write ends it.
            queued = await front.start(request(settings, ctx), None)
            await front.cancel(queued.run_id, wait_s=30)
            recorder.once(queued.run_id, "cancelled")

            sandboxes = cast(SandboxManager, Slots())
            async with (
                RunManager(
                    settings, stores.contexts, stores.runs, owners=configured_owners(settings), ends=ends
                ) as runs,
                QueueWorker(settings.queue, queue, stores.runs, runs, sandboxes, engine, ends=ends),
            ):
                done = await front.start(request(settings, ctx, session_id=None), None)
                with anyio.fail_after(60):
                    await done.done.wait()
                await wait_until(lambda: any(t.run_id == done.run_id for t in recorder.told), within_s=30)
                recorder.once(done.run_id, "completed")

                running = await front.start(request(settings, ctx), None)
                await wait_until(lambda: running.progress.status == "running", within_s=60)
                await front.cancel(running.run_id, wait_s=60)
                await wait_until(lambda: any(t.run_id == running.run_id for t in recorder.told), within_s=30)
                recorder.once(running.run_id, "cancelled")
        assert sorted(t.run_id for t in recorder.told) == sorted([queued.run_id, done.run_id, running.run_id])


async def test_a_run_whose_session_ended_is_told_once_as_never_started(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as ((settings, stores), queue, recorder, ctx):
        ends = RunEnds([recorder])

        async def engine() -> RLMEngine:
            return RLMEngine(settings.engine, FakeChatModel(root=[submit("'42'")]), FakeSandboxFactory())

        sandboxes = cast(SandboxManager, Slots())
        async with (
            QueueFront(settings.queue, queue, Wakeups(queue), ends=ends) as front,
            RunManager(settings, stores.contexts, stores.runs, owners=configured_owners(settings), ends=ends) as runs,
            QueueWorker(
                settings,
                queue,
                stores.runs,
                runs,
                sandboxes,
                engine,
                sessions=WorkerSessions(settings.kept_sessions, PgSessionStore(stores.lifecycle), stores.contexts),
                ends=ends,
            ),
        ):
            run = await front.start(request(settings, ctx, session_id="sess_ended_before_run"), None)
            with anyio.fail_after(60):
                await run.done.wait()
            await wait_until(lambda: any(t.run_id == run.run_id for t in recorder.told), within_s=30)
            ended = recorder.once(run.run_id, "error")
            assert ended.session_id == "sess_ended_before_run"
            assert (
                ended.record.not_started is not None
                and "ended before this run started" in ended.record.not_started.cause
            )
        assert [t.run_id for t in recorder.told] == [run.run_id]
