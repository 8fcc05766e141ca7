"""A team worker's context pins over a real PostgreSQL: a run's claim pins its contexts in the
claim's statement (`queue_statements.CLAIM`) and its final write removes them in its own
(`queue_statements.UNPIN` beside FINISH_LOGGED), so a run sends no pin statement of its own;
everything a pin guarantees stays as it was: a running run's context cannot be deleted by its
owner, a context deleted while its run is queued fails the run when a worker takes it up, a stale
attempt's refused final write still lets its pins go, a claimed run that never starts lets them
go, and a run whose end is not that write releases them through the pins' own exit. No Docker:
the engine runs on the fake model and sandboxes of tests/fixtures_engine.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import BadArgumentError
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunRecord, RunRequest
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.queue.worker import QueueWorker, claimed_pins
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.context_model import ContextInfo
from rlm_mcp.store.pg import Database
from rlm_mcp.store.pg.contexts import PgContextStore
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, submit
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

ALICE = Owner("local")


class Slots:
    """What a worker reads of its sandbox manager (the engine's sandboxes are the fake ones)."""

    owner_id = "owner-pins"
    free_slots = 4
    max_slots = 4
    reclaim = None
    can_snapshot = True


class CountedUnpins:
    """Counts the pins' own statements of a store: its releases (`PgContextStore._unpin`) and
    its pins (`_pin`)."""

    def __init__(self, contexts: PgContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.pins = 0
        unpin, pin = contexts._unpin, contexts._pin

        async def counted(pin_id: str) -> None:
            self.calls += 1
            await unpin(pin_id)

        async def counted_pin(context_ids: list[str], pin_id: str, owner: Owner) -> list[ContextInfo]:
            self.pins += 1
            return await pin(context_ids, pin_id, owner)

        monkeypatch.setattr(contexts, "_unpin", counted)
        monkeypatch.setattr(contexts, "_pin", counted_pin)


async def pins(db: Database) -> list[tuple[str, str]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT pin_id, context_id FROM rlm_pins ORDER BY pin_id")
        return [(r["pin_id"], r["context_id"]) for r in await cur.fetchall()]


@asynccontextmanager
async def team(tmp_path: Path, url: str) -> AsyncIterator[tuple[Any, Any, PgRunQueue, Database, str]]:
    settings = make_settings(tmp_path, database_url=url, worker_lease_s=5.0, queue_poll_s=0.2)
    async with make_stores(settings, replica=True) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database) and isinstance(stores.runs, PgRunStore)
        assert isinstance(stores.contexts, PgContextStore)
        queue = PgRunQueue(queue_rules(settings.queue), db)
        info = await stores.contexts.put_bytes(
            b"The magic number is 42.", name="ctx", format="text", source={"kind": "text"}, owner=ALICE
        )
        yield settings, stores, queue, db, info.context_id


def request(settings: Any, context_id: str) -> RunRequest:
    return RunRequest(query="q", context_ids=[context_id], limits=make_limits(settings), owner=ALICE)


def run_record_of(req: RunRequest) -> RunRecord:
    limits = {"max_iterations": 5, "max_depth": 1, "timeout_s": 60.0, "token_budget": None, "max_errors": 3}
    stored = {"query": req.query, "context_ids": req.context_ids, "owner": str(req.owner), "limits": limits}
    return run_record("run_stale_pins00001", stored | {"status": "queued"})


async def test_a_worker_runs_pin_is_held_while_it_runs_and_removed_by_its_final_write(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with team(tmp_path, pg_url) as (settings, stores, queue, db, ctx):
        unpins = CountedUnpins(stores.contexts, monkeypatch)
        # Models handed out in claim order: the first run answers, the second waits for an hour.
        models = [FakeChatModel(root=[submit("'42'")]), FakeChatModel(root_delay_s=3600)]

        async def engine() -> RLMEngine:
            return RLMEngine(settings.engine, models.pop(0), FakeSandboxFactory())

        async def unpinned() -> bool:
            return await pins(db) == []

        front = QueueFront(settings.queue, queue, Wakeups(queue))
        async with (
            front,
            RunManager(settings, stores.contexts, stores.runs, owners=configured_owners(settings)) as runs,
            QueueWorker(settings.queue, queue, stores.runs, runs, cast(SandboxManager, Slots()), engine),
        ):
            done = await front.start(request(settings, ctx), None)
            with anyio.fail_after(60):
                await done.done.wait()
            assert done.progress.status == "completed"
            await wait_until(unpinned, within_s=30, what="the completed run's pin removed")
            assert unpins.calls == 0  # its final write removed the pin: no statement of its own
            assert unpins.pins == 0  # and its claim took it

            running = await front.start(request(settings, ctx), None)

            async def pinned() -> bool:
                return [cid for _, cid in await pins(db)] == [ctx]

            await wait_until(pinned, within_s=60, what="the running run's pin")
            # Pinned while it runs: its owner cannot delete the context (as before).
            with pytest.raises(BadArgumentError, match="in use by a running run"):
                await stores.contexts.delete(ctx, owner=ALICE)
            await front.cancel(running.run_id, wait_s=60)  # it ends through its final write too
            await wait_until(unpinned, within_s=30, what="the cancelled run's pin removed")
            assert (unpins.calls, unpins.pins) == (0, 0)
        assert await stores.contexts.delete(ctx, owner=ALICE)  # nothing pins it any more


async def test_a_context_deleted_while_its_run_is_queued_fails_the_run_as_before(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (settings, stores, queue, db, ctx):
        front = QueueFront(settings.queue, queue, Wakeups(queue))
        async with front:
            queued = await front.start(request(settings, ctx), None)
            assert await stores.contexts.delete(ctx, owner=ALICE)  # a queued run holds no pin

            async def engine() -> RLMEngine:
                return RLMEngine(settings.engine, FakeChatModel(root=[submit("'42'")]), FakeSandboxFactory())

            async with (
                RunManager(settings, stores.contexts, stores.runs, owners=configured_owners(settings)) as runs,
                QueueWorker(settings.queue, queue, stores.runs, runs, cast(SandboxManager, Slots()), engine),
            ):
                with anyio.fail_after(60):
                    await queued.done.wait()
        row = await queue.read(queued.run_id)
        assert row is not None and row.done
        result = row.summary.to_stored()["result"]
        assert result["status"] == "error" and ctx in result["reason"]
        assert await pins(db) == []


async def test_a_claim_pins_its_runs_contexts_and_a_stale_attempts_final_write_still_removes_them(
    tmp_path: Path, pg_url: str
) -> None:
    async with team(tmp_path, pg_url) as (settings, stores, queue, db, ctx):
        worker = await queue.register_worker("owner-w", 2)
        await queue.enqueue(run_record_of(request(settings, ctx)), 1)
        first = await queue.claim(worker, 4, 4)
        assert first is not None and first.pins is not None
        # Pinned by the claim, as the context store pins: this replica's, the owner's row.
        assert [(r["context_id"], r["chars"]) for r in first.pins.rows] == [(ctx, len("The magic number is 42."))]
        assert await pins(db) == [(f"{first.run_id}/{first.attempt}", ctx)]
        with pytest.raises(BadArgumentError, match="in use by a running run"):
            await stores.contexts.delete(ctx, owner=ALICE)
        stale = await stores.runs.reopen(first.run_id, attempt=first.attempt)
        # The run goes back to the queue and is claimed again: the first attempt is stale.
        assert await queue.requeue(first.run_id, first.attempt, first.summary)
        second = await queue.claim(worker, 4, 4)
        assert second is not None and second.attempt == first.attempt + 1 and second.pins is not None

        held = claimed_pins(first)
        assert held is not None and held.infos is not None and held.infos[0].context_id == ctx
        ended = first.summary.ended("cancelled", "stopped")
        assert not await stale.finish(ended, pins=held)  # fenced: the run is not ended ...
        assert held.released and await pins(db) == [(second.pins.pin_id, ctx)]  # ... but its pins went
        row = await queue.read(first.run_id)
        assert row is not None and not row.done and row.attempt == second.attempt

        # Pins a claim took for a run that never starts are let go (`Contexts.release`).
        unclaimed = claimed_pins(second)
        assert unclaimed is not None
        await stores.contexts.release(unclaimed)
        assert await pins(db) == []


async def test_a_claim_leaves_a_run_whose_contexts_it_cannot_all_pin_to_the_workers_pin(
    tmp_path: Path, pg_url: str
) -> None:
    async with team(tmp_path, pg_url) as (settings, stores, queue, db, ctx):
        worker = await queue.register_worker("owner-w", 2)
        other = await stores.contexts.put_bytes(
            b"Soon gone.", name="gone", format="text", source={"kind": "text"}, owner=ALICE
        )
        both = request(settings, ctx).model_copy(update={"context_ids": [ctx, other.context_id]})
        await queue.enqueue(run_record_of(both), 1)
        assert await stores.contexts.delete(other.context_id, owner=ALICE)  # a queued run holds no pin
        row = await queue.claim(worker, 4, 4)
        assert row is not None and row.pins is None and await pins(db) == []  # all or none


async def test_a_claim_leaves_a_row_queued_without_its_context_ids_to_the_workers_pin(
    tmp_path: Path, pg_url: str
) -> None:
    async with team(tmp_path, pg_url) as (settings, stores, queue, db, ctx):
        worker = await queue.register_worker("owner-w", 2)
        record = run_record_of(request(settings, ctx))
        await queue.enqueue(record, 1)
        async with db.connection() as conn:  # as an earlier release queued it: no ids on the row
            await conn.execute("UPDATE rlm_runs SET context_ids = NULL WHERE run_id = %s", [record.run_id])
        row = await queue.claim(worker, 4, 4)
        assert row is not None and row.pins is None and await pins(db) == []


async def test_a_claimed_run_that_never_starts_lets_its_claims_pins_go(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (settings, stores, queue, db, ctx):
        started = anyio.Event()

        async def engine() -> RLMEngine:
            started.set()
            raise RuntimeError("no engine here")

        front = QueueFront(settings.queue, queue, Wakeups(queue))
        async with (
            front,
            RunManager(settings, stores.contexts, stores.runs, owners=configured_owners(settings)) as runs,
            QueueWorker(settings.queue, queue, stores.runs, runs, cast(SandboxManager, Slots()), engine),
        ):
            await front.start(request(settings, ctx), None)
            with anyio.fail_after(60):
                await started.wait()

            async def unpinned() -> bool:
                return await pins(db) == []

            await wait_until(unpinned, within_s=30, what="the claim's pins let go")
