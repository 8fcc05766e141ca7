"""The queue's sweeper against a real PostgreSQL, in process: several sweepers at once end a lost
worker's run exactly once (naming the worker), queue a run that had no LM reply again exactly
once, and end it the second time its worker is lost. No Docker: the "workers" here are rows that
claimed jobs through Procrastinate and then stopped heartbeating."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from procrastinate.jobs import Status

from rlm_mcp.config import Settings
from rlm_mcp.service.queue import records
from rlm_mcp.service.queue.app import QUEUE, defer_run, make_app
from rlm_mcp.service.queue.sweeper import HOUSEKEEPING_EVERY, LEASE_SLACK_S, Sweeper
from rlm_mcp.store.factory import make_stores
from rlm_mcp.store.pg.db import Database

pytestmark = pytest.mark.anyio


def summary(run_id: str) -> dict[str, Any]:
    limits = {"max_iterations": 5, "max_depth": 1, "timeout_s": 60.0, "token_budget": None, "max_errors": 3}
    return {
        "query": "q",
        "context_ids": ["c"],
        "owner": "local",
        "limits": limits,
        "status": "running",
        "run_id": run_id,
    }


async def test_concurrent_sweepers_end_a_lost_run_once_and_requeue_a_fresh_one_once(
    tmp_path: Path, pg_url: str
) -> None:
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "data", worker_lease_s=5.0)
    stores = make_stores(settings)
    async with stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        app = make_app(pg_url)
        await app.open_async()
        try:
            manager = app.job_manager
            worker = await manager.register_worker()
            await records.register_worker(db, worker, "owner-lost")
            runs = {}
            for name, lm_called in (("run_swept_lost0000001", True), ("run_swept_fresh000001", False)):
                await stores.runs.create(name, summary(name))
                await records.set_job(db, name, await defer_run(app, name))
                job = await manager.fetch_job(queues=[QUEUE], worker_id=worker)
                assert job is not None
                claimed = await records.claim(db, str(job.task_kwargs["run_id"]), worker)
                assert claimed is not None
                runs[claimed.run_id] = job
                async with db.connection() as conn:
                    await conn.execute("UPDATE rlm_runs SET lm_called = %s WHERE run_id = %s", (lm_called, name))

            async def silence() -> None:
                async with db.connection() as conn:
                    await conn.execute(
                        "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour' WHERE id = %s",
                        (worker,),
                    )

            async def sweep_together(rounds: int = 3) -> None:
                sweepers = [Sweeper(settings, db, app) for _ in range(3)]
                async with anyio.create_task_group() as tg:
                    for sweeper in sweepers:
                        for _ in range(rounds):
                            tg.start_soon(sweeper.sweep_once)

            await silence()
            await sweep_together()

            lost = await records.read(db, "run_swept_lost0000001")
            assert lost is not None and lost.done
            assert lost.summary["result"]["status"] == "error"
            reason = lost.summary["result"]["reason"]
            assert f"worker {worker} (host " in reason and f"pid {os.getpid()})" in reason and "rlm_start" in reason
            assert await manager.get_job_status_async(runs["run_swept_lost0000001"].id or 0) == Status.FAILED

            fresh = await records.read(db, "run_swept_fresh000001")
            assert fresh is not None and not fresh.done and fresh.requeues == 1
            assert fresh.summary["status"] == "queued" and "queued again" in fresh.summary["notice"]

            # Taken again by a worker that is lost too: this time it ends (once is the limit).
            again = await manager.fetch_job(queues=[QUEUE], worker_id=worker)
            assert again is not None and again.task_kwargs["run_id"] == "run_swept_fresh000001"
            await records.claim(db, "run_swept_fresh000001", worker)
            await silence()
            await sweep_together()
            ended = await records.read(db, "run_swept_fresh000001")
            assert ended is not None and ended.done and ended.requeues == 1
            assert ended.summary["result"]["status"] == "error"
        finally:
            await app.close_async()


async def test_doctor_lists_as_live_only_workers_within_the_lease(tmp_path: Path, pg_url: str) -> None:
    """`rlm-mcp doctor`'s workers view applies RLM_MCP_WORKER_LEASE_S, the lease the sweepers
    apply: a worker silent for 12 s is lost under a 5 s lease and live under a 60 s one."""
    from rlm_mcp.doctor import _team

    async def workers(lease_s: float) -> str:
        settings = Settings(database_url=pg_url, data_dir=tmp_path / "doctor", worker_lease_s=lease_s)
        return {c.name: c.detail for c in await _team(settings)}["workers"]

    settings = Settings(database_url=pg_url, data_dir=tmp_path / "data", worker_lease_s=5.0)
    stores = make_stores(settings)
    async with stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        app = make_app(pg_url)
        await app.open_async()
        try:
            worker = await app.job_manager.register_worker()
            await records.register_worker(db, worker, "owner-quiet")
            async with db.connection() as conn:
                await conn.execute(
                    "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '12 seconds' WHERE id = %s",
                    (worker,),
                )
            assert await workers(5.0) == "none alive"
            shown = await workers(60.0)
            assert f"worker {worker} on " in shown and f"pid {os.getpid()} (heartbeat" in shown, shown
        finally:
            await app.close_async()


async def test_the_next_sweep_comes_when_a_lease_can_next_end(tmp_path: Path, pg_url: str) -> None:
    """The sweepers' schedule (sweeper.py): with no worker, every few poll intervals; with a
    live worker, just after its lease can end (the lease bound holds: never later than that
    plus a poll interval); every poll interval while a running job has no worker."""
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "data", worker_lease_s=30.0, queue_poll_s=1.0)
    stores = make_stores(settings)
    async with stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        app = make_app(pg_url)
        await app.open_async()
        try:
            sweeper = Sweeper(settings, db, app)
            assert await sweeper.sweep_once() == HOUSEKEEPING_EVERY * settings.queue_poll_s  # nobody to lose
            worker = await app.job_manager.register_worker()
            async with db.connection() as conn:
                await conn.execute(
                    "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '28 seconds' WHERE id = %s",
                    (worker,),
                )
            due = await sweeper.sweep_once()  # its lease ends in about 2 s: sooner than housekeeping
            assert settings.queue_poll_s <= due <= 2.0 + LEASE_SLACK_S
            await stores.runs.create("run_orphaned00000001", summary("run_orphaned00000001"))
            await defer_run(app, "run_orphaned00000001")
            assert await app.job_manager.fetch_job(queues=[QUEUE], worker_id=worker) is not None
            await app.job_manager.unregister_worker(worker)  # its running job is left with no worker
            assert await sweeper.sweep_once() == settings.queue_poll_s
        finally:
            await app.close_async()
