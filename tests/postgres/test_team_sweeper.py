"""The run queue's state machine and sweeper against a real PostgreSQL, in process: several
sweepers at once end a lost worker's run exactly once (naming the worker) and queue a run that
had no LM reply again exactly once; a NUL in a query never stalls a sweep; a sweeper that has
just reached the database waits a full lease before it declares anyone lost; claims are fenced,
fair and shared per owner; the waiting bound holds under concurrent starts on two replicas.
No Docker: the "workers" here are rows that claimed runs and then stopped heartbeating."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.errors import BusyError
from rlm_mcp.events import TurnStart
from rlm_mcp.ports.queue import RunRow
from rlm_mcp.ports.runs import RunEnded
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.sweeper import HOUSEKEEPING_EVERY, LEASE_SLACK_S, Sweeper
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.runs import PgRunStore
from tests.fixtures_sessions import team
from tests.fixtures_store import final, summary
from tests.fixtures_sweepers import Clock, connected_sweepers, silence

pytestmark = pytest.mark.anyio


async def sweep_together(sweepers: list[Sweeper], rounds: int = 3) -> None:
    async with anyio.create_task_group() as tg:
        for sweeper in sweepers:
            for _ in range(rounds):
                tg.start_soon(sweeper.sweep_once)


async def test_concurrent_sweepers_end_a_lost_run_once_and_requeue_a_fresh_one_once(
    tmp_path: Path, pg_url: str
) -> None:
    async with team(tmp_path, pg_url) as (db, queue, settings):
        worker = await queue.register_worker("owner-lost", 4)
        for name, lm_called in (("run_swept_lost0000001", True), ("run_swept_fresh000001", False)):
            await queue.enqueue(summary(name), 1)
            claimed = await queue.claim(worker, 8, 8)
            assert claimed is not None and claimed.run_id == name and claimed.attempt == 1
            async with db.connection() as conn:
                await conn.execute("UPDATE rlm_runs SET lm_called = %s WHERE run_id = %s", (lm_called, name))
        sweepers = await connected_sweepers(settings, queue)
        await silence(db, worker)
        await sweep_together(sweepers)

        lost = await queue.read("run_swept_lost0000001")
        assert lost is not None and lost.done
        assert lost.summary.to_stored()["result"]["status"] == "error"
        reason = lost.summary.to_stored()["result"]["reason"]
        assert f"worker {worker} (host " in reason and f"pid {os.getpid()})" in reason and "rlm_start" in reason

        fresh = await queue.read("run_swept_fresh000001")
        assert fresh is not None and fresh.state == "queued" and fresh.requeues == 1 and fresh.worker_id is None
        assert fresh.summary.to_stored()["status"] == "queued" and "queued again" in fresh.summary.to_stored()["notice"]

        # Taken again by a worker that is lost too: this time it ends (once is the limit).
        again = await queue.claim(worker, 8, 8)
        assert again is not None and again.run_id == "run_swept_fresh000001" and again.attempt == 2
        await silence(db, worker)
        await sweep_together(sweepers)
        ended = await queue.read("run_swept_fresh000001")
        assert ended is not None and ended.done and ended.requeues == 1
        assert ended.summary.to_stored()["result"]["status"] == "error"


class Told:
    """A run-end hook: what it was told, with the run's row as it read it then."""

    def __init__(self, queue: PgRunQueue) -> None:
        self._queue = queue
        self.told: list[RunEnded] = []
        self.rows: list[RunRow | None] = []

    async def __call__(self, ended: RunEnded) -> None:
        self.rows.append(await self._queue.read(ended.run_id))
        self.told.append(ended)


async def test_concurrent_sweepers_tell_each_end_once_after_its_record(tmp_path: Path, pg_url: str) -> None:
    """The run-end hook, shared by three sweepers: a lost worker's run that had an LM reply ends
    and is told once; one that had none is queued again and not told; a run no worker took ends
    at the queue timeout and is told once. Each time the final record was committed first."""
    async with team(tmp_path, pg_url, run_queue_timeout_s=30.0, queue_poll_s=0.2) as (db, queue, settings):
        told = Told(queue)
        worker = await queue.register_worker("owner-ends", 4)
        for name, lm_called in (("run_ends_lost0000001", True), ("run_ends_fresh000001", False)):
            await queue.enqueue(summary(name), 1)
            assert await queue.claim(worker, 8, 8) is not None
            async with db.connection() as conn:
                await conn.execute("UPDATE rlm_runs SET lm_called = %s WHERE run_id = %s", (lm_called, name))
        sweepers = await connected_sweepers(settings, queue, ends=RunEnds([told]))
        await silence(db, worker)
        await sweep_together(sweepers)
        assert [t.run_id for t in told.told] == ["run_ends_lost0000001"]
        [ended], [row] = told.told, told.rows
        assert row is not None and row.done and row.summary == ended.record
        assert ended.status == "error" and ended.record.result is not None
        assert f"worker {worker} (host " in (ended.record.result.reason or "")

        await queue.enqueue(summary("run_ends_stale000001"), 1)
        async with db.connection() as conn:
            await conn.execute(
                "UPDATE rlm_runs SET queued_at = now() - interval '1 minute' WHERE run_id = 'run_ends_stale000001'"
            )
        for sweeper in sweepers:
            sweeper._housekept_at = float("-inf")
        await sweep_together(sweepers)
        assert [t.run_id for t in told.told] == ["run_ends_lost0000001", "run_ends_stale000001"]
        stale, stale_row = told.told[1], told.rows[1]
        assert stale_row is not None and stale_row.done and stale_row.summary == stale.record
        assert stale.status == "error" and stale.record.result is not None
        assert "RLM_MCP_RUN_QUEUE_TIMEOUT_S" in (stale.record.result.reason or "")


async def test_a_nul_in_a_query_never_stalls_the_sweeps(tmp_path: Path, pg_url: str) -> None:
    """A run whose query holds a NUL, lost before its first LM reply, is queued again; a second
    loss ends it; and the sweeps go on doing their work for the other runs all along."""
    async with team(tmp_path, pg_url, run_queue_timeout_s=30.0, queue_poll_s=0.2) as (db, queue, settings):
        worker = await queue.register_worker("owner-nul", 4)
        await queue.enqueue(summary("run_nul_query0000001", query="a\x00b"), 1)
        claimed = await queue.claim(worker, 8, 8)
        assert claimed is not None and claimed.summary.to_stored()["query"] == "a\x00b"
        store = PgRunStore(db)
        log = await store.reopen(claimed.run_id, attempt=claimed.attempt)
        log.stage(TurnStart(run_id=claimed.run_id, iteration=1, max_iterations=5, depth=0))
        assert await log.flush()  # its log holds an event (the former sweeps cast every line to jsonb)
        [sweeper] = await connected_sweepers(settings, queue, 1)
        await silence(db, worker)
        await sweeper.sweep_once()
        row = await queue.read("run_nul_query0000001")
        assert row is not None and row.state == "queued" and row.requeues == 1
        again = await queue.claim(worker, 8, 8)
        assert again is not None and again.run_id == row.run_id
        await silence(db, worker)
        await sweeper.sweep_once()
        row = await queue.read("run_nul_query0000001")
        assert row is not None and row.done and row.summary.to_stored()["query"] == "a\x00b"
        # Later sweeps still work: a run no worker takes ends at the queue timeout.
        await queue.enqueue(summary("run_after_nul0000001"), 1)
        async with db.connection() as conn:
            await conn.execute("UPDATE rlm_runs SET queued_at = now() - interval '1 minute' WHERE state = 'queued'")
        sweeper._housekept_at = float("-inf")
        await sweeper.sweep_once()
        timed_out = await queue.read("run_after_nul0000001")
        assert (
            timed_out is not None
            and timed_out.done
            and "RLM_MCP_RUN_QUEUE_TIMEOUT_S" in timed_out.summary.to_stored()["notice"]
        )


async def test_a_sweeper_judges_leases_only_after_a_full_lease_connected(tmp_path: Path, pg_url: str) -> None:
    """After an outage every heartbeat is old: a sweeper that has just reached the database (or
    whose last round failed) gives the workers a full lease to heartbeat again."""
    async with team(tmp_path, pg_url) as (db, queue, settings):
        worker = await queue.register_worker("owner-outage", 4)
        await queue.enqueue(summary("run_outage0000000001"), 1)
        assert await queue.claim(worker, 8, 8) is not None
        await silence(db, worker)  # as after a database outage longer than the lease
        clock = Clock()
        sweeper = Sweeper(settings.queue, queue, clock=clock)
        due = await sweeper.sweep_once()
        row = await queue.read("run_outage0000000001")
        assert row is not None and row.state == "running"  # not judged yet
        assert due <= settings.team.worker_lease_s + LEASE_SLACK_S
        await queue.heartbeat(worker)  # the worker is back within the lease
        clock.now += settings.team.worker_lease_s + 1
        await sweeper.sweep_once()
        row = await queue.read("run_outage0000000001")
        assert row is not None and row.state == "running" and row.attempt == 1
        # Positive control: silent past a lease the sweeper was connected for, it is lost.
        await silence(db, worker)
        await sweeper.sweep_once()
        row = await queue.read("run_outage0000000001")
        assert row is not None and row.state == "queued"


async def test_a_worker_resumed_after_its_run_was_claimed_again_writes_nothing(tmp_path: Path, pg_url: str) -> None:
    """Fencing: the first attempt's log flushes, summaries, requeue and finish match nothing
    once the run is another attempt's; the second attempt's rows and end stand."""
    async with team(tmp_path, pg_url) as (db, queue, settings):
        store = PgRunStore(db)
        first_worker = await queue.register_worker("owner-frozen", 4)
        await queue.enqueue(summary("run_fenced0000000001"), 1)
        first = await queue.claim(first_worker, 8, 8)
        assert first is not None
        first_log = await store.reopen(first.run_id, attempt=first.attempt)
        [sweeper] = await connected_sweepers(settings, queue, 1)
        await silence(db, first_worker)
        await sweeper.sweep_once()
        second_worker = await queue.register_worker("owner-second", 4)
        second = await queue.claim(second_worker, 8, 8)
        assert second is not None and second.run_id == first.run_id and second.attempt == first.attempt + 1
        second_log = await store.reopen(second.run_id, attempt=second.attempt)
        event = TurnStart(run_id=first.run_id, iteration=1, max_iterations=5, depth=0)
        second_log.stage(event)
        assert await second_log.flush(summary=summary(first.run_id, status="running", iterations=1))
        first_log.stage(event)  # the frozen worker resumes
        assert not await first_log.flush(
            summary=summary(first.run_id, status="running", iterations=9), mark_lm_called=True
        )
        assert not await queue.requeue(first.run_id, first.attempt, summary(first.run_id))
        assert not await queue.finish(first.run_id, final(first.run_id), attempt=first.attempt)
        beat = await queue.heartbeat(first_worker)
        assert first.run_id not in beat.held  # what tells the resumed worker to stop the run
        assert (await queue.heartbeat(second_worker)).held == {first.run_id: (second.attempt, False)}
        async with db.connection() as conn:
            cur = await conn.execute("SELECT attempt FROM rlm_run_events WHERE run_id = %s", (first.run_id,))
            attempts = [r["attempt"] for r in await cur.fetchall()]
        row = await queue.read(first.run_id)
        assert attempts == [second.attempt]
        assert (
            row is not None
            and row.summary.to_stored()["iterations"] == 1
            and not row.lm_called
            and row.state == "running"
        )
        assert await queue.finish(first.run_id, final(first.run_id), attempt=second.attempt)


async def test_claims_are_fair_and_each_owner_holds_at_most_its_share(tmp_path: Path, pg_url: str) -> None:
    """Several tokens: one owner's running runs hold at most its share of all live workers' slots
    (RLM_MCP_MAX_RUNS_PER_OWNER's default: half of them); the next claim takes the oldest run of
    the owner with the fewest running."""
    tokens = {"auth_tokens": ["token-a", "token-b"]}
    async with team(tmp_path, pg_url, **tokens) as (_, queue, _settings):
        worker = await queue.register_worker("owner-fair", 4)  # 4 slots in all: a share of 2
        for i in range(5):
            await queue.enqueue(summary(f"run_fair_a{i:010d}", "a"), 1)
        await queue.enqueue(summary("run_fair_b0000000000", "b"), 1)
        order = []
        while (row := await queue.claim(worker, 8, 8)) is not None:
            order.append(row.run_id)
        assert order == ["run_fair_a0000000000", "run_fair_b0000000000", "run_fair_a0000000001"]
        await queue.finish(order[0], final(order[0]), attempt=1)
        row = await queue.claim(worker, 8, 8)
        assert row is not None and row.run_id == "run_fair_a0000000002"
    # One token: no share, the owner may use every slot (positive control).
    async with team(tmp_path, pg_url, auth_tokens=["token-a"]) as (_, queue, _settings):
        worker = await queue.register_worker("owner-solo", 4)
        for i in range(3):
            await queue.enqueue(summary(f"run_solo_{i:011d}", "c"), 1)
        assert [await queue.claim(worker, 8, 8) is not None for _ in range(3)] == [True, True, True]


async def test_claims_wait_for_the_sandbox_slots_a_run_needs(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        worker = await queue.register_worker("owner-slots", 4)
        await queue.enqueue(summary("run_deep000000000001"), 3)
        await queue.enqueue(summary("run_shallow000000001"), 1)
        row = await queue.claim(worker, 2, 8)  # the older run needs 3: the shallow one goes first
        assert row is not None and row.run_id == "run_shallow000000001"
        assert await queue.claim(worker, 2, 8) is None
        row = await queue.claim(worker, 2, 2)  # a worker with 2 slots in all takes it with both free
        assert row is not None and row.run_id == "run_deep000000000001"


async def test_the_waiting_bound_holds_under_concurrent_starts_on_two_replicas(tmp_path: Path, pg_url: str) -> None:
    """32 starts at once against two replicas, bound 20 per owner: exactly 20 are queued."""
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "a", run_max_queued_per_owner=20)
    other = Settings(database_url=pg_url, data_dir=tmp_path / "b", run_max_queued_per_owner=20)
    async with make_stores(settings) as one, make_stores(other) as two:
        assert isinstance(one.lifecycle, Database) and isinstance(two.lifecycle, Database)
        queues = [
            PgRunQueue(queue_rules(settings.queue), one.lifecycle),
            PgRunQueue(queue_rules(other.queue), two.lifecycle),
        ]
        accepted, refused = [], []

        async def start(i: int) -> None:
            run_id = f"run_bound{i:011d}"
            try:
                await queues[i % 2].enqueue(summary(run_id, "tok"), 1)
                accepted.append(run_id)
            except BusyError:
                refused.append(run_id)

        async with anyio.create_task_group() as tg:
            for i in range(32):
                tg.start_soon(start, i)
        assert len(accepted) == 20 and len(refused) == 12
        assert await queues[0].queued_counts("tok") == (20, 20)


async def test_doctor_lists_as_live_only_workers_within_the_lease(tmp_path: Path, pg_url: str) -> None:
    """`rlm-mcp doctor`'s workers view applies RLM_MCP_WORKER_LEASE_S, the lease the sweepers
    apply: a worker silent for 12 s is lost under a 5 s lease and live under a 60 s one."""
    from rlm_mcp.doctor import _team

    async def workers(lease_s: float) -> str:
        settings = Settings(database_url=pg_url, data_dir=tmp_path / "doctor", worker_lease_s=lease_s)
        return {c.name: c.detail for c in await _team(settings)}["workers"]

    async with team(tmp_path, pg_url) as (db, queue, _settings):
        worker = await queue.register_worker("owner-quiet", 4)
        async with db.connection() as conn:
            await conn.execute(
                "UPDATE rlm_workers SET heartbeat_at = now() - interval '12 seconds' WHERE worker_id = %s", (worker,)
            )
        assert await workers(5.0) == "none alive"
        shown = await workers(60.0)
        assert f"worker {worker} on " in shown and f"pid {os.getpid()} (heartbeat" in shown, shown


async def test_the_next_sweep_comes_when_a_lease_can_next_end(tmp_path: Path, pg_url: str) -> None:
    """The sweepers' schedule (sweeper.py): with no worker, every few poll intervals; with a
    live worker, just after its lease can end (the lease bound holds: never later than that
    plus a poll interval)."""
    async with team(tmp_path, pg_url, worker_lease_s=6.0, queue_poll_s=0.5) as (db, queue, settings):
        [sweeper] = await connected_sweepers(settings, queue, 1)
        housekeeping = HOUSEKEEPING_EVERY * settings.team.queue_poll_s
        assert await sweeper.sweep_once() == housekeeping  # nobody to lose: 2.5 s
        worker = await queue.register_worker("owner-sched", 4)
        async with db.connection() as conn:
            await conn.execute(
                "UPDATE rlm_workers SET heartbeat_at = now() - interval '4.5 seconds' WHERE worker_id = %s", (worker,)
            )
        # Its lease ends in about 1.5 s, sooner than housekeeping (a stall of up to ~1.5 s between
        # the two statements leaves it so).
        due = await sweeper.sweep_once()
        assert settings.team.queue_poll_s <= due <= 1.5 + LEASE_SLACK_S < housekeeping


async def test_pruning_removes_finished_runs_only_by_the_databases_clock(tmp_path: Path, pg_url: str) -> None:
    """Old finished records go; a live run's record stays however old its row looks."""
    async with team(tmp_path, pg_url) as (db, queue, settings):
        store = PgRunStore(db)
        await queue.enqueue(summary("run_live_old00000001"), 1)
        await queue.enqueue(summary("run_done_old00000001"), 1)
        await queue.cancel("run_done_old00000001", final("run_done_old00000001"))
        async with db.connection() as conn:
            await conn.execute("UPDATE rlm_runs SET updated_at = updated_at - 40 * 86400")
        removed = await store.prune(max_records=1000, max_age_days=30)
        assert removed == ["run_done_old00000001"]
        assert await queue.read("run_live_old00000001") is not None


async def test_a_front_whose_clock_is_behind_does_not_shorten_the_queue_timeout(tmp_path: Path, pg_url: str) -> None:
    """Queue times are the database's: a run queued by a front two minutes behind is not timed out
    at once under a 60 s queue timeout; aged past it by the database's clock, it is."""
    import time

    async with team(tmp_path, pg_url, run_queue_timeout_s=60.0) as (db, queue, settings):
        # The front's own times (the record it writes) are two minutes behind the database's.
        await queue.enqueue(summary("run_behind0000000001", created_at=time.time() - 120), 1)
        assert await queue.stale_queued() == []
        async with db.connection() as conn:  # positive control: really older than the timeout
            await conn.execute("UPDATE rlm_runs SET queued_at = now() - interval '61 seconds'")
        assert await queue.stale_queued() == ["run_behind0000000001"]
