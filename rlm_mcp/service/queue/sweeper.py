"""Leases: what happens to runs whose worker died, and to runs no worker takes.

Every team-mode process sweeps; a transaction-level advisory lock lets one sweep at a time do the
work (the others skip that round), and every write it makes is conditional as well (Procrastinate's `finish_job`/`retry_job` refuse a job that is no longer
`doing`; `records.finish` writes only over a run that has not ended).

- A run whose worker's heartbeat is older than RLM_MCP_WORKER_LEASE_S (`get_stalled_jobs`) ends
  `error`, with a reason naming the lost worker (host, pid) and what to do; Procrastinate never
  retries it by itself. Exception: a run that had not called the LM yet is queued again, once.
- A run still queued after RLM_MCP_RUN_QUEUE_TIMEOUT_S is cancelled in the queue and ends
  `error`, saying whether any worker is alive.
- Processes with a sandbox backend (workers) also remove the sandboxes of lost workers on their
  Docker host, by owner label, never a live worker's, and keep `LeaseLiveness` current.

When: not every poll interval, but when a lease can next expire. Each sweep reads the oldest
heartbeat of the workers still within their lease (a worker's lease can only move later: a
heartbeat renews it) and the next sweep comes just after that lease ends (never sooner than one
poll interval from now), or sooner: at most every HOUSEKEEPING_EVERY poll intervals (the slower rules) and never later than
one lease (a worker registered after this sweep is seen before its own lease can end), and every
poll interval while a running job has no worker (its worker stopped without ending it). So the
runs of a dead worker still end within RLM_MCP_WORKER_LEASE_S plus one poll interval of its last
heartbeat, and an idle team sweeps every few seconds instead of every poll interval.
"""

from __future__ import annotations

import logging
import socket
import time

import anyio
import procrastinate
from procrastinate.jobs import Status

from rlm_mcp.config import Settings
from rlm_mcp.ports.runs import Notice, NoticeKind, RunPhase, RunRecord
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue import records
from rlm_mcp.service.queue.app import QUEUE
from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.store.pg.db import Conn, Database
from rlm_mcp.store.pg.migrations import ADVISORY_LOCK_KEY

log = logging.getLogger("rlm_mcp.queue")

SWEEP_LOCK_KEY = ADVISORY_LOCK_KEY + 1
FORGET_AFTER_S = 86400.0
# Lost workers are looked for every round (their runs end within the lease plus one poll
# interval); queue timeouts, orphans and old rows once every HOUSEKEEPING_EVERY poll intervals,
# at most: their deadlines are longer.
HOUSEKEEPING_EVERY = 5
LEASE_SLACK_S = 0.05  # after a lease's end, so that the sweep finds it ended
ORPHAN_AFTER_S = 60.0  # a run record with no job this old is an orphan (queueing takes milliseconds)


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        app: procrastinate.App,
        sandboxes: SandboxManager | None = None,
        liveness: LeaseLiveness | None = None,
    ) -> None:
        self._settings = settings
        self._db = db
        self._app = app
        self._sandboxes = sandboxes
        self._liveness = liveness
        self._housekept_at = float("-inf")

    async def run_forever(self) -> None:
        delay = self._settings.queue_poll_s
        while True:
            await anyio.sleep(delay)
            try:
                delay = await self.sweep_once()
            except Exception as exc:  # PostgreSQL restarting, Docker away: next round
                log.info("queue sweep failed: %s", exc)
                delay = self._settings.queue_poll_s

    async def sweep_once(self) -> float:
        """One round; the seconds until the next one is due (see the module's docstring)."""
        poll, lease = self._settings.queue_poll_s, self._settings.worker_lease_s
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                "SELECT pg_try_advisory_xact_lock(%s) AS got, "
                "(SELECT extract(epoch FROM min(last_heartbeat) - now()) FROM procrastinate_workers "
                " WHERE last_heartbeat > now() - make_interval(secs => %s)) AS oldest_s, "
                "EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status = 'doing' AND worker_id IS NULL) AS orphaned",
                (SWEEP_LOCK_KEY, lease),
            )
            row = await cur.fetchone()
            assert row is not None
            if row["got"]:
                await self._lost_runs(conn)
                now = time.monotonic()
                if now - self._housekept_at >= HOUSEKEEPING_EVERY * poll:  # the slower rules
                    self._housekept_at = now
                    await self._queue_timeouts(conn)
                    await self._forget_old_workers(conn)
        if self._sandboxes is not None:
            await self._lost_sandboxes()
        due = min(HOUSEKEEPING_EVERY * poll, lease)
        if row["orphaned"]:
            due = poll
        elif row["oldest_s"] is not None:  # just after the first lease that can end
            due = min(due, float(row["oldest_s"]) + lease + LEASE_SLACK_S)
        return max(poll, due)

    async def _lost_runs(self, conn: Conn) -> None:
        lease = self._settings.worker_lease_s
        manager = self._app.job_manager
        for job in await manager.get_stalled_jobs(queue=QUEUE, seconds_since_heartbeat=lease):
            run_id = str(job.task_kwargs.get("run_id"))
            row = await records.read(self._db, run_id)
            fresh = row is not None and not row.done and not row.lm_called and row.requeues == 0
            # `lm_called` is marked when the first answered LM call is recorded (runlog.py); the
            # log is read as well, so the rule holds whatever wrote the flag (or did not).
            if row is not None and fresh and not await records.had_lm_reply(self._db, run_id):
                who = await records.worker_ref(self._db, row.worker_id)
                await manager.retry_job(job)  # raises if another sweep got there first
                notice = Notice(kind=NoticeKind.REQUEUED_WORKER_LOST, worker=who)
                summary = RunRecord.from_stored(row.summary).model_copy(
                    update={"status": "queued", "phase": RunPhase.QUEUED, "notice": notice}
                )
                await records.requeue(self._db, run_id, summary)
                log.warning("run %s: %s lost before its first LM call; queued again", run_id, who.render())
                continue
            await manager.finish_job(job, status=Status.FAILED, delete_job=False)
            if row is None or row.done:
                continue
            who = await records.worker_ref(self._db, row.worker_id)
            lost = Notice(kind=NoticeKind.WORKER_LOST, worker=who, lease_s=lease)
            if await records.finish(self._db, run_id, records.final_summary(row.summary, "error", lost), conn=conn):
                log.warning("run %s ended: %s lost", run_id, who.render())

    async def _forget_old_workers(self, conn: Conn) -> None:
        """Keep the worker tables small: rows of workers gone for a day (their runs have ended
        and their sandboxes were removed by then)."""
        await self._app.job_manager.prune_stalled_workers(FORGET_AFTER_S)
        await conn.execute("DELETE FROM rlm_workers WHERE gone_at < %s", (time.time() - FORGET_AFTER_S,))

    async def _queue_timeouts(self, conn: Conn) -> None:
        timeout = self._settings.run_queue_timeout_s
        # A record without a job: its front stopped between writing it and queueing it (or it
        # was in flight on a replica of a version without the queue). Nobody will run it.
        cur = await conn.execute(
            "SELECT run_id FROM rlm_runs WHERE NOT done AND job_id IS NULL AND created_at < %s",
            (time.time() - max(timeout, ORPHAN_AFTER_S),),
        )
        for item in await cur.fetchall():
            row = await records.read(self._db, item["run_id"])
            if row is not None and row.job_id is None:
                reason = (
                    "The replica that accepted the run stopped before it was queued. Start it again with rlm_start."
                )
                await records.finish(
                    self._db, row.run_id, records.final_summary(row.summary, "error", reason), conn=conn
                )
        # A job that ended while its run did not: its worker failed before it could record the
        # run (its final record is written before the job ends, and retried through outages).
        cur = await conn.execute(
            "SELECT r.run_id FROM rlm_runs r JOIN procrastinate_jobs j ON j.id = r.job_id WHERE NOT r.done "
            "AND j.status IN ('succeeded', 'failed', 'aborted', 'cancelled') AND r.updated_at < %s",
            (time.time() - ORPHAN_AFTER_S,),
        )
        for item in await cur.fetchall():
            row = await records.read(self._db, item["run_id"])
            if row is not None and not row.done:
                reason = (
                    "The worker that took the run failed before it could record its end. Start it again with rlm_start."
                )
                await records.finish(
                    self._db, row.run_id, records.final_summary(row.summary, "error", reason), conn=conn
                )
        cur = await conn.execute(
            "SELECT r.run_id, r.job_id FROM rlm_runs r JOIN procrastinate_jobs j ON j.id = r.job_id "
            "WHERE NOT r.done AND j.status = 'todo' AND r.updated_at < %s",
            (time.time() - timeout,),
        )
        stale = await cur.fetchall()
        if not stale:
            return
        alive = await records.live_workers(self._db, self._settings.worker_lease_s)
        why = (
            "no worker is alive (start one: rlm-mcp serve --role worker, or --role both), then start the run again"
            if alive == 0
            else f"{alive} live worker(s) were all busy; try again later, or add workers or raise RLM_MCP_MAX_RUNS"
        )
        reason = f"No worker took the run within {timeout:.0f} s (RLM_MCP_RUN_QUEUE_TIMEOUT_S): {why}."
        for item in stale:
            if not await self._app.job_manager.cancel_job_by_id_async(item["job_id"]):
                continue  # a worker took it meanwhile
            row = await records.read(self._db, item["run_id"])
            if row is not None:
                await records.finish(
                    self._db, row.run_id, records.final_summary(row.summary, "error", reason), conn=conn
                )

    async def _lost_sandboxes(self) -> None:
        assert self._sandboxes is not None
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT w.worker_id, w.owner_id, w.host, "
                "(p.id IS NOT NULL AND p.last_heartbeat > now() - make_interval(secs => %s)) AS live "
                "FROM rlm_workers w LEFT JOIN procrastinate_workers p ON p.id = w.worker_id WHERE w.gone_at IS NULL",
                (self._settings.worker_lease_s,),
            )
            rows = await cur.fetchall()
        mine = self._sandboxes.owner_id
        live = {r["owner_id"] for r in rows if r["live"]} | {mine}
        lost = [r for r in rows if r["owner_id"] not in live]
        if self._liveness is not None:
            self._liveness.live = frozenset(live)
            self._liveness.lost = frozenset(r["owner_id"] for r in lost)
        here = socket.gethostname()
        for r in lost:
            if r["host"] != here:
                continue  # its sandboxes are on its own host's container engine
            await self._sandboxes.ensure_ready()
            await self._sandboxes.backend.remove_owned(r["owner_id"])
            async with self._db.connection() as conn:
                await conn.execute(
                    "UPDATE rlm_workers SET gone_at = %s WHERE worker_id = %s", (time.time(), r["worker_id"])
                )
            log.warning("removed the sandboxes of lost worker %s (pid %s)", r["worker_id"], r["owner_id"])
