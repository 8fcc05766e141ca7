"""The run-end hook in embedded mode: every way a run ends (completed, error, cancelled,
timeout, never started, cancelled by the server's shutdown) tells every subscriber exactly once,
after the run's final record is written; a failing subscriber changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import EVERY_OWNER, Owner
from rlm_mcp.ports.chat import LMConnectionError
from rlm_mcp.ports.runs import RunEnded, RunRecord, RunRequest
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.ports import RunStorePort
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings, repl, submit

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")


class Recorder:
    """A run-end hook that keeps what it was told and the stored record as it read it then."""

    def __init__(self, records: RunStorePort) -> None:
        self._records = records
        self.told: list[RunEnded] = []
        self.stored: list[RunRecord] = []

    async def __call__(self, ended: RunEnded) -> None:
        self.stored.append(await self._records.read_summary(ended.run_id, owner=EVERY_OWNER))
        self.told.append(ended)


@asynccontextmanager
async def manager(
    tmp_path: Path, lm: FakeChatModel, **overrides: Any
) -> AsyncIterator[tuple[RunManager, RLMEngine, Recorder, str]]:
    settings = make_settings(tmp_path, **overrides)
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory())
    async with make_stores(settings) as stores:
        recorder = Recorder(stores.runs)

        async def failing(ended: RunEnded) -> None:
            raise RuntimeError("a subscriber that fails")

        ends = RunEnds([failing, recorder])
        async with RunManager(
            settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server), ends=ends
        ) as runs:
            info = await stores.contexts.put_bytes(
                b"The magic number is 42.", name="ctx", format="text", source={"kind": "text"}, owner=ALICE
            )
            yield runs, engine, recorder, info.context_id


def request(context_id: str, tmp_path: Path, *, session_id: str | None = None, **limits: Any) -> RunRequest:
    return RunRequest(
        query="q",
        context_ids=[context_id],
        limits=make_limits(make_settings(tmp_path), **limits),
        owner=ALICE,
        session_id=session_id,
    )


def assert_told_once_after_the_record(recorder: Recorder, run: ActiveRun, status: str) -> RunEnded:
    told = [t for t in recorder.told if t.run_id == run.run_id]
    assert len(told) == 1
    ended = told[0]
    assert (ended.status, ended.owner, ended.record.status) == (status, ALICE, status)
    assert ended.record.result is not None and ended.record.result.status == status
    stored = recorder.stored[recorder.told.index(ended)]
    assert stored.done and stored.status == status  # the final record was written before the hook ran
    assert stored.to_stored() == ended.record.to_stored()
    return ended


async def test_a_completed_run_is_told_once_after_its_record(tmp_path: Path) -> None:
    async with manager(tmp_path, FakeChatModel(root=[submit("'42'")])) as (runs, engine, recorder, ctx):
        run = await runs.start(request(ctx, tmp_path, session_id="sess_1"), engine)
        await run.done.wait()
        ended = assert_told_once_after_the_record(recorder, run, "completed")
        assert ended.session_id == "sess_1"


async def test_an_error_end_is_told_once_after_its_record(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl("print(1)"), LMConnectionError("connection refused", endpoint="http://x/v1")])
    async with manager(tmp_path, lm) as (runs, engine, recorder, ctx):
        run = await runs.start(request(ctx, tmp_path), engine)
        await run.done.wait()
        assert_told_once_after_the_record(recorder, run, "error")


async def test_a_run_that_never_started_is_told_once_after_its_record(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[LMConnectionError("vLLM at http://x/v1 is unreachable", endpoint="http://x/v1")])
    async with manager(tmp_path, lm) as (runs, engine, recorder, ctx):
        run = await runs.start(request(ctx, tmp_path), engine)
        await run.done.wait()
        ended = assert_told_once_after_the_record(recorder, run, "error")
        assert ended.record.not_started is not None and "unreachable" in ended.record.not_started.cause


async def test_a_cancelled_run_is_told_once_after_its_record(tmp_path: Path) -> None:
    async with manager(tmp_path, FakeChatModel(root_delay_s=3600)) as (runs, engine, recorder, ctx):
        run = await runs.start(request(ctx, tmp_path), engine)
        await wait_until(lambda: run.progress.status == "running", within_s=30)
        await runs.cancel(run.run_id, wait_s=30)
        assert run.done.is_set()
        assert_told_once_after_the_record(recorder, run, "cancelled")


async def test_a_timed_out_run_is_told_once_after_its_record(tmp_path: Path) -> None:
    async with manager(tmp_path, FakeChatModel(root_delay_s=3600)) as (runs, engine, recorder, ctx):
        run = await runs.start(request(ctx, tmp_path, timeout_s=0.2), engine)
        await run.done.wait()
        assert_told_once_after_the_record(recorder, run, "timeout")


async def test_runs_ended_by_the_shutdown_are_told_once_after_their_records(tmp_path: Path) -> None:
    async with manager(tmp_path, FakeChatModel(root_delay_s=3600), max_runs=1) as (runs, engine, recorder, ctx):
        first = await runs.start(request(ctx, tmp_path), engine)
        second = await runs.start(request(ctx, tmp_path), engine)
        # One takes the slot, the other waits for it: which one is not this test's business (each
        # creates its record and pins before it asks for a slot, so the second may ask first).
        await wait_until(lambda: {first.progress.status, second.progress.status} == {"running", "queued"}, within_s=30)
    for run in (first, second):
        ended = assert_told_once_after_the_record(recorder, run, "cancelled")
        assert ended.record.notice is not None and ended.record.notice.render() == "the server shut down"
    assert len(recorder.told) == 2


def test_the_team_end_writes_it_wraps_are_the_queue_ports_own() -> None:
    """`EndReporting` hands every other call through to the queue: each end write it tells the
    hook of must still be a method of the port (a renamed one would silently never tell)."""
    from rlm_mcp.ports.queue import FencedRunLog, RunQueuePort
    from rlm_mcp.service.queue.ends import EndReporting

    wrapped = {name for name in vars(EndReporting) if not name.startswith("_")}
    assert wrapped == {"finish", "finish_by", "cancel", "end_or_requeue_lost", "time_out"}
    # `finish_by` wraps the run log's own final write (its last events and the fenced end in one
    # statement), which must stay a method of the log's port.
    assert wrapped - {"finish_by"} <= {name for name in dir(RunQueuePort) if not name.startswith("_")}
    assert "finish" in {name for name in dir(FencedRunLog) if not name.startswith("_")}
