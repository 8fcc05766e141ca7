"""The run queue's rules, written once and run over both implementations of its port: the
in-memory queue in the fast tier (tests/unit/test_queue_rules.py, a clock the test moves) and
PostgreSQL (tests/postgres/test_queue_rules_pg.py). Each rule reaches the parts that apply it:
the port (enqueue bounds, fair claims, fencing), the `Sweeper` (lost workers, queue timeouts,
a full lease connected before judging), the `QueueFront` (follow a run to its end, cancel) and
the `QueueWorker` (tests/fixtures_queue_worker_rules.py).

A rule is an async function of `open_team`, which opens a fresh queue with settings overrides
and yields a `Team` (tests/fixtures_queue_team.py).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import anyio
import pytest

from rlm_mcp.errors import BusyError
from rlm_mcp.events import TurnStart
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.queue import RunState
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.service.queue.sweeper import Sweeper
from rlm_mcp.service.queue.wakeups import Wakeups
from tests.fixtures_queue_follow_rules import FOLLOW_RULES
from tests.fixtures_queue_lane_rules import LANE_RULES
from tests.fixtures_queue_team import Clock, OpenTeam, connected_sweeper, final, summary
from tests.fixtures_queue_worker_rules import WORKER_RULES

# --- the rules ---------------------------------------------------------------------------------


async def rule_waiting_bounds_refuse_the_run_over_them(open_team: OpenTeam) -> None:
    async with open_team(run_max_queued=3, run_max_queued_per_owner=2) as team:
        q = team.queue
        await q.enqueue(summary("run_bound_a000000001", "a"), 1)
        await q.enqueue(summary("run_bound_a000000002", "a"), 1)
        with pytest.raises(BusyError, match="You already have 2 runs waiting"):
            await q.enqueue(summary("run_bound_a000000003", "a"), 1)
        await q.enqueue(summary("run_bound_b000000001", "b"), 1)
        with pytest.raises(BusyError, match="queue is full: 3 runs waiting"):
            await q.enqueue(summary("run_bound_b000000002", "b"), 1)
        assert await q.queued_counts("a") == (3, 2)
        assert await q.read("run_bound_a000000003") is None


async def rule_claims_are_fair_and_each_owner_holds_at_most_its_share(open_team: OpenTeam) -> None:
    async with open_team(auth_tokens=["token-a", "token-b"]) as team:
        q = team.queue
        worker = await q.register_worker("owner-fair", 4)  # 4 slots in all: a share of 2
        for i in range(5):
            await q.enqueue(summary(f"run_fair_a{i:010d}", "a"), 1)
        await q.enqueue(summary("run_fair_b0000000000", "b"), 1)
        order = []
        while (row := await q.claim(worker, 8, 8)) is not None:
            order.append(row.run_id)
        assert order == ["run_fair_a0000000000", "run_fair_b0000000000", "run_fair_a0000000001"]
        assert await q.finish(order[0], final(order[0]), attempt=1)
        row = await q.claim(worker, 8, 8)
        assert row is not None and row.run_id == "run_fair_a0000000002"
    async with open_team(auth_tokens=["token-a"]) as team:  # one token: every slot (positive control)
        worker = await team.queue.register_worker("owner-solo", 4)
        for i in range(3):
            await team.queue.enqueue(summary(f"run_solo_{i:011d}", "c"), 1)
        assert [await team.queue.claim(worker, 8, 8) is not None for _ in range(3)] == [True, True, True]


async def rule_claims_wait_for_the_sandbox_slots_a_run_needs(open_team: OpenTeam) -> None:
    async with open_team() as team:
        q = team.queue
        worker = await q.register_worker("owner-need", 4)
        await q.enqueue(summary("run_need_three000001"), 3)
        assert await q.claim(worker, 2, 8) is None  # two free, three needed
        row = await q.claim(worker, 3, 8)
        assert row is not None and row.state is RunState.RUNNING and row.attempt == 1 and row.worker_id == worker
        await q.enqueue(summary("run_need_beyond000001"), 10)  # more than this worker has: all of its slots
        assert await q.claim(worker, 3, 4) is None
        assert await q.claim(worker, 4, 4) is not None


async def rule_a_batch_claim_takes_what_claims_one_by_one_would(open_team: OpenTeam) -> None:
    """`claim_many`: the fair order and each owner's share counted run by run inside the batch,
    the sandbox needs summed against the free slots, each row its own attempt (fenced apart,
    requeued apart when its worker is lost), and a burst spread over the live workers."""
    async with open_team(auth_tokens=["token-a", "token-b"]) as team:
        q = team.queue
        worker = await q.register_worker("owner-batch", 4)  # 4 slots in all: a share of 2
        for i in range(5):
            await q.enqueue(summary(f"run_batch_a{i:09d}", "a"), 1)
        await q.enqueue(summary("run_batch_b000000000", "b"), 1)
        rows = await q.claim_many(worker, 8, 8, limit=8)
        assert [r.run_id for r in rows] == ["run_batch_a000000000", "run_batch_b000000000", "run_batch_a000000001"]
        assert all(r.state is RunState.RUNNING and r.attempt == 1 and r.worker_id == worker for r in rows)
        assert await q.claim_many(worker, 8, 8, limit=8) == []  # each owner at its share
        assert await q.finish(rows[0].run_id, final(rows[0].run_id), attempt=1)
        assert [r.run_id for r in await q.claim_many(worker, 8, 8, limit=8)] == ["run_batch_a000000002"]
        # Each row is its own attempt: ending one leaves the other's fence as it was.
        assert not await q.finish(rows[1].run_id, final(rows[1].run_id), attempt=2)
        assert await q.finish(rows[1].run_id, final(rows[1].run_id), attempt=1)
    async with open_team() as team:
        q = team.queue
        worker = await q.register_worker("owner-needs", 8)
        await q.enqueue(summary("run_needs_1_two00001"), 2)
        await q.enqueue(summary("run_needs_2_two00002"), 2)
        await q.enqueue(summary("run_needs_3_one00003"), 1)
        # Two then two more do not fit three free slots: the batch stops at the first that does not.
        assert [r.run_id for r in await q.claim_many(worker, 3, 8, limit=8)] == ["run_needs_1_two00001"]
        assert [r.run_id for r in await q.claim_many(worker, 1, 8, limit=8)] == ["run_needs_3_one00003"]
        assert [r.run_id for r in await q.claim_many(worker, 2, 8, limit=1)] == ["run_needs_2_two00002"]
    async with open_team() as team:
        q = team.queue
        sweeper = await connected_sweeper(team)  # before the workers: connecting passes a lease
        first, second = await q.register_worker("owner-first", 8), await q.register_worker("owner-second", 8)
        for i in range(4):
            await q.enqueue(summary(f"run_spread{i:010d}"), 1)
        # Two live workers: one claim takes half of what is queued, rounded up.
        taken = await q.claim_many(first, 8, 8, limit=8)
        assert [r.run_id for r in taken] == ["run_spread0000000000", "run_spread0000000001"]
        assert [r.run_id for r in await q.claim_many(second, 8, 8, limit=8)] == ["run_spread0000000002"]
        await team.silence(first)  # no LM reply yet: each of its runs queued again, alone
        await sweeper.sweep_once()
        for row in taken:
            again = await q.read(row.run_id)
            assert again is not None and again.state is RunState.QUEUED and again.requeues == 1
            assert not await q.requeue(row.run_id, row.attempt, summary(row.run_id))  # the old attempt: fenced
        retaken = await q.claim_many(second, 8, 8, limit=8)
        assert sorted(r.run_id for r in retaken) == [
            "run_spread0000000000",
            "run_spread0000000001",
            "run_spread0000000003",
        ]
        assert {r.run_id: r.attempt for r in retaken} == {
            "run_spread0000000000": 2,
            "run_spread0000000001": 2,
            "run_spread0000000003": 1,
        }


async def rule_a_run_preferring_a_worker_waits_for_it_unless_it_is_lost(open_team: OpenTeam) -> None:
    async with open_team() as team:
        q = team.queue
        held, other = await q.register_worker("owner-held", 4), await q.register_worker("owner-other", 4)
        await q.enqueue(summary("run_prefer0000000001"), 1, prefer_worker=held, prefer_s=600.0)
        assert await q.claim(other, 8, 8) is None
        await team.silence(held)  # the preferred worker is lost: any worker may take it
        row = await q.claim(other, 8, 8)
        assert row is not None and row.run_id == "run_prefer0000000001"


async def rule_a_worker_takes_the_runs_preferring_it_before_its_owners_older_runs(open_team: OpenTeam) -> None:
    # A run offered to a worker (the local lane, a kept session's follow-up) waits for that worker
    # alone; any worker may take the owner's older runs. Taking those first filled the worker's
    # last slot and left the offered run to wait out its preference.
    async with open_team() as team:
        q = team.queue
        mine, other = await q.register_worker("owner-mine", 4), await q.register_worker("owner-other", 4)
        await q.enqueue(summary("run_anyone0000000001"), 1)
        await q.enqueue(summary("run_offered000000001"), 1, prefer_worker=mine, prefer_s=600.0)
        row = await q.claim(mine, 8, 8)
        assert row is not None and row.run_id == "run_offered000000001"
        row = await q.claim(other, 8, 8)  # the older run still goes to any worker
        assert row is not None and row.run_id == "run_anyone0000000001"


async def rule_a_resumed_worker_writes_nothing_over_the_next_attempt(open_team: OpenTeam) -> None:
    """Fencing: the first attempt's log flushes, requeue and finish match nothing once the run is
    another attempt's; the heartbeat tells the resumed worker; the second attempt's writes stand."""
    async with open_team() as team:
        q = team.queue
        first_worker = await q.register_worker("owner-frozen", 4)
        await q.enqueue(summary("run_fenced0000000001"), 1)
        first = await q.claim(first_worker, 8, 8)
        assert first is not None
        first_log = await team.logs.reopen(first.run_id, attempt=first.attempt)
        sweeper = await connected_sweeper(team)
        await team.silence(first_worker)
        await sweeper.sweep_once()  # no LM reply yet: queued again
        second_worker = await q.register_worker("owner-second", 4)
        second = await q.claim(second_worker, 8, 8)
        assert second is not None and second.run_id == first.run_id and second.attempt == first.attempt + 1
        second_log = await team.logs.reopen(second.run_id, attempt=second.attempt)
        event = TurnStart(run_id=first.run_id, iteration=1, max_iterations=5, depth=0)
        second_log.stage(event)
        assert await second_log.flush(summary=summary(first.run_id, status="running", iterations=1))
        first_log.stage(event)  # the frozen worker resumes
        assert not await first_log.flush(
            summary=summary(first.run_id, status="running", iterations=9), mark_lm_called=True
        )
        assert not await q.requeue(first.run_id, first.attempt, summary(first.run_id))
        assert not await q.finish(first.run_id, final(first.run_id), attempt=first.attempt)
        assert first.run_id not in (await q.heartbeat(first_worker)).held
        assert (await q.heartbeat(second_worker)).held == {first.run_id: (second.attempt, False)}
        assert await team.event_attempts(first.run_id) == [second.attempt]
        row = await q.read(first.run_id)
        assert row is not None and row.summary.iterations == 1 and not row.lm_called and row.state is RunState.RUNNING
        assert await q.finish(first.run_id, final(first.run_id), attempt=second.attempt)
        assert not await q.finish(first.run_id, final(first.run_id))  # ended once


async def rule_sweepers_end_a_lost_run_once_and_requeue_a_fresh_one_once(open_team: OpenTeam) -> None:
    async with open_team() as team:
        q = team.queue
        worker = await q.register_worker("owner-lost", 4)
        for name, lm_called in (("run_swept_lost0000001", True), ("run_swept_fresh000001", False)):
            await q.enqueue(summary(name), 1)
            claimed = await q.claim(worker, 8, 8)
            assert claimed is not None and claimed.run_id == name and claimed.attempt == 1
            await team.set_lm_called(name, lm_called)
        sweepers = [await connected_sweeper(team) for _ in range(3)]
        await team.silence(worker)
        async with anyio.create_task_group() as tg:
            for sweeper in sweepers:
                tg.start_soon(sweeper.sweep_once)
        lost = await q.read("run_swept_lost0000001")
        assert lost is not None and lost.done and lost.summary.result is not None
        assert lost.summary.result.status == "error"
        reason = lost.summary.result.reason or ""
        assert f"worker {worker} (host " in reason and f"pid {os.getpid()})" in reason and "rlm_start" in reason
        fresh = await q.read("run_swept_fresh000001")
        assert fresh is not None and fresh.state is RunState.QUEUED and fresh.requeues == 1 and fresh.worker_id is None
        assert fresh.summary.status == "queued" and "queued again" in (fresh.summary.to_stored()["notice"])
        again = await q.claim(worker, 8, 8)  # taken by a worker lost too: this time it ends
        assert again is not None and again.run_id == "run_swept_fresh000001" and again.attempt == 2
        await team.silence(worker)
        await sweepers[0].sweep_once()
        ended = await q.read("run_swept_fresh000001")
        assert ended is not None and ended.done and ended.requeues == 1


async def rule_a_sweeper_judges_leases_only_after_a_full_lease_connected(open_team: OpenTeam) -> None:
    async with open_team() as team:
        q = team.queue
        worker = await q.register_worker("owner-outage", 4)
        await q.enqueue(summary("run_outage0000000001"), 1)
        assert await q.claim(worker, 8, 8) is not None
        with anyio.fail_after(team.settings.team.worker_lease_s + 30):
            while (await q.sweep_look()).up_s < team.settings.team.worker_lease_s:
                await team.pass_time(0.2)
        await team.silence(worker)  # as after a database outage longer than the lease
        clock = Clock()
        sweeper = Sweeper(team.settings.queue, q, clock=clock)
        await sweeper.sweep_once()
        row = await q.read("run_outage0000000001")
        assert row is not None and row.state is RunState.RUNNING  # not judged yet
        await q.heartbeat(worker)  # back within the lease
        clock.now += team.settings.team.worker_lease_s + 1
        await sweeper.sweep_once()
        row = await q.read("run_outage0000000001")
        assert row is not None and row.state is RunState.RUNNING and row.attempt == 1
        await team.silence(worker)  # positive control: silent past a lease it was connected for
        await sweeper.sweep_once()
        row = await q.read("run_outage0000000001")
        assert row is not None and row.state is RunState.QUEUED


async def rule_a_run_no_worker_takes_ends_at_the_queue_timeout(open_team: OpenTeam) -> None:
    async with open_team(run_queue_timeout_s=30.0) as team:
        await team.queue.enqueue(summary("run_timeout000000001"), 1)
        sweeper = Sweeper(team.settings.queue, team.queue, clock=Clock())
        await sweeper.sweep_once()
        row = await team.queue.read("run_timeout000000001")
        assert row is not None and row.state is RunState.QUEUED  # not yet
        await team.age_queued(60.0)
        sweeper._housekept_at = float("-inf")
        await sweeper.sweep_once()
        row = await team.queue.read("run_timeout000000001")
        assert row is not None and row.done
        notice = row.summary.to_stored()["notice"]
        assert "RLM_MCP_RUN_QUEUE_TIMEOUT_S" in notice and "no worker is alive" in notice


async def rule_a_front_follows_a_run_to_its_end_and_cancels_a_queued_one(open_team: OpenTeam) -> None:
    async with open_team(queue_poll_s=0.2) as team:
        q = team.queue
        async with QueueFront(team.settings.queue, q, Wakeups(q)) as front:
            # No context named: a front's start has the enqueue check the run's contexts are its
            # owner's (over PostgreSQL; tests/postgres/test_team_start.py), and none is stored here.
            request = summary("run_unused0000000000", context_ids=[]).request
            run = await front.start(request, None, run_id="run_front00000000001")
            assert run.progress.status == "queued"
            worker = await q.register_worker("owner-front", 4)
            row = await q.claim(worker, 8, 8)
            assert row is not None and row.run_id == run.run_id
            log = await team.logs.reopen(row.run_id, attempt=row.attempt)
            assert await log.flush(summary=summary(row.run_id, status="running", iterations=2), announce=True)
            ended = summary(row.run_id, status="completed", iterations=2, result={"status": "completed"})
            assert not await log.flush(summary=ended, announce=True)  # final: the run is no longer live
            with anyio.fail_after(30):
                await run.done.wait()
            assert run.result is not None and run.result.status == "completed" and run.progress.iterations == 2

            queued = await front.start(request, None, run_id="run_front00000000002")
            await front.cancel(queued.run_id, wait_s=30)
            assert queued.done.is_set() and queued.result is not None and queued.result.status == "cancelled"
            stored = await q.read(queued.run_id)
            assert stored is not None and stored.done
            assert await front.find(queued.run_id, owner=EVERY_OWNER) is queued  # its mirror, kept a while


async def rule_a_cancel_reaches_the_worker_of_a_running_run(open_team: OpenTeam) -> None:
    async with open_team() as team:
        q = team.queue
        worker = await q.register_worker("owner-cancel", 4)
        await q.enqueue(summary("run_cancel0000000001"), 1)
        assert await q.claim(worker, 8, 8) is not None
        assert not await q.cancel("run_cancel0000000001", final("run_cancel0000000001"))
        assert await q.cancels(worker) == ["run_cancel0000000001"]
        assert (await q.heartbeat(worker)).held == {"run_cancel0000000001": (1, True)}
        row = await q.read("run_cancel0000000001")
        assert row is not None and row.state is RunState.RUNNING  # its worker writes the end


async def rule_the_gauges_and_the_sweeps_see_live_and_lost_workers(open_team: OpenTeam) -> None:
    """The /metrics gauges (depth, live workers) and the sweeper's view of the workers, which
    `LeaseLiveness` hands the sandbox reaper: a silent worker's owner is lost, a live one's not."""
    async with open_team() as team:
        q = team.queue
        live, silent = await q.register_worker("owner-live", 2), await q.register_worker("owner-silent", 2)
        for i in range(2):
            await q.enqueue(summary(f"run_gauge{i:011d}"), 1)
        depth, oldest, alive = await q.gauges()
        assert (depth, alive) == (2, 2) and oldest >= 0.0
        await team.silence(silent)
        assert await q.live_workers() == 1
        liveness = LeaseLiveness()
        sweeper = await connected_sweeper(team, liveness)
        await q.heartbeat(live)  # connecting took a lease: the live worker beats, the silent one not
        await team.silence(silent)
        await sweeper.sweep_once()
        assert liveness.live == {"owner-live"} and liveness.lost == {"owner-silent"}
        lost = (await q.sweep_look()).lost_workers
        assert [w.worker_id for w in lost] == [silent] and live != silent


RULES: list[Callable[[OpenTeam], Awaitable[None]]] = [
    rule_waiting_bounds_refuse_the_run_over_them,
    rule_claims_are_fair_and_each_owner_holds_at_most_its_share,
    rule_claims_wait_for_the_sandbox_slots_a_run_needs,
    rule_a_batch_claim_takes_what_claims_one_by_one_would,
    rule_a_run_preferring_a_worker_waits_for_it_unless_it_is_lost,
    rule_a_worker_takes_the_runs_preferring_it_before_its_owners_older_runs,
    rule_a_resumed_worker_writes_nothing_over_the_next_attempt,
    rule_sweepers_end_a_lost_run_once_and_requeue_a_fresh_one_once,
    rule_a_sweeper_judges_leases_only_after_a_full_lease_connected,
    rule_a_run_no_worker_takes_ends_at_the_queue_timeout,
    rule_a_front_follows_a_run_to_its_end_and_cancels_a_queued_one,
    rule_a_cancel_reaches_the_worker_of_a_running_run,
    rule_the_gauges_and_the_sweeps_see_live_and_lost_workers,
    *WORKER_RULES,
    *FOLLOW_RULES,
    *LANE_RULES,
]
RULE_IDS = [rule.__name__.removeprefix("rule_") for rule in RULES]

__all__ = ["RULES", "RULE_IDS"]
