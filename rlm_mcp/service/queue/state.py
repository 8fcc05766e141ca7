"""Every statement on team-mode run state (`port.RunQueuePort`), on PostgreSQL; the worker
statements it inherits are in `registry.py`.

A run's row in `rlm_runs` is its one state machine (drawn in `port.py` and docs/architecture.md);
`rlm_workers` holds the workers, each with a heartbeat set by the database's `now()`. Rules kept
here, so that no other module needs to know them:

- One clock: every time another replica compares (heartbeats, leases, queue timeouts, claim
  times, record ages) is the database's; no statement compares this process's `time.time()`.
- Claims (`claim`): one transaction under an advisory lock, so the per-owner share and the
  order are exact across workers: of the queued runs whose sandbox need fits the worker's free
  sandbox slots and whose owner runs fewer than its share, the oldest run of the owner with the
  fewest running runs; the claim bumps `attempt` and names the worker.
- Fencing: a worker's writes (`requeue`, `finish` with `attempt`, and its run log's flushes,
  `store.pg.runs.PgRunLog`) match `(run_id, attempt, state = 'running')`; False means the run
  is no longer this worker's.
- Preference: a run may name a worker (`prefer_worker`, the one holding a kept session's live
  sandbox) that alone may claim it until `prefer_until`, unless that worker is gone or silent.
- The waiting bound (`enqueue`): counted and inserted in one transaction under an advisory
  lock, so concurrent starts on any number of replicas never overshoot it.
- Sweeps: each lost run and each timed-out queued run in its own transaction, its row locked
  with SKIP LOCKED and its condition checked again, so concurrent sweepers act once, and one
  run's failure never stops the others. No statement parses a run's summary or log as JSON in
  SQL (a NUL character in a query would make PostgreSQL's jsonb refuse it).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from rlm_mcp.observability import metrics
from rlm_mcp.ports.runs import Notice, NoticeKind, RunPhase, RunRecord
from rlm_mcp.service.queue.ends import final_summary
from rlm_mcp.service.queue.port import RunRow
from rlm_mcp.service.queue.registry import PgWorkerRegistry
from rlm_mcp.service.queue.sql import CHANNEL, NOW, QUEUE_CHANNEL
from rlm_mcp.service.run_queue import owner_run_share, queue_refusal
from rlm_mcp.store.pg.db import Conn
from rlm_mcp.store.pg.migrations import ADVISORY_LOCK_KEY

log = logging.getLogger("rlm_mcp.queue")

CLAIM_LOCK_KEY = ADVISORY_LOCK_KEY + 2
ENQUEUE_LOCK_KEY = ADVISORY_LOCK_KEY + 3

_COLUMNS = (
    "run_id, owner, state, attempt, summary, worker_id, lm_called, requeues, next_seq, log_bytes, created_at, "
    "cancel_requested"
)
# A worker is lost when its row is gone, it said it is gone, or its heartbeat is older than the lease.
_LOST = "(w.worker_id IS NULL OR w.gone_at IS NOT NULL OR w.heartbeat_at < now() - make_interval(secs => %s))"


def _row(row: dict[str, Any]) -> RunRow:
    return RunRow(
        run_id=row["run_id"],
        owner=row["owner"],
        state=row["state"],
        attempt=int(row["attempt"]),
        summary=json.loads(row["summary"]),
        worker_id=row["worker_id"],
        lm_called=bool(row["lm_called"]),
        requeues=int(row["requeues"]),
        next_seq=int(row["next_seq"]),
        log_bytes=int(row["log_bytes"]),
        created_at=float(row["created_at"]),
        cancel_requested=bool(row["cancel_requested"]),
    )


def _dump(record: RunRecord) -> str:
    return json.dumps(record.to_stored(), ensure_ascii=False)


class PgRunQueue(PgWorkerRegistry):
    """`port.RunQueuePort` on the team database: the run statements here, the worker statements
    from `registry.PgWorkerRegistry`."""

    # --- fronts -----------------------------------------------------------------------------

    async def enqueue(
        self, record: RunRecord, need: int, *, prefer_worker: int | None = None, prefer_s: float = 0.0
    ) -> None:
        """Insert the queued run unless a waiting bound is reached (raises `BusyError`), and wake
        the workers. Counted and inserted under one lock: concurrent starts never overshoot.
        `prefer_worker`: for `prefer_s` seconds only that worker may claim the run (a kept
        session's follow-up waits for the worker that holds its live sandbox), unless it is lost."""
        settings = self._settings
        run_id, owner = record.run_id, str(record.request.owner)
        async with self._db.transaction() as conn:
            # The lock first, in a statement of its own: the count below must see every run
            # inserted by the starts that held it before (a statement's snapshot is taken when
            # it begins). Then count, insert and wake the workers in one statement.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (ENQUEUE_LOCK_KEY,))
            cur = await conn.execute(
                "WITH c AS (SELECT count(*) AS total, count(*) FILTER (WHERE owner = %(owner)s) AS mine "
                "  FROM rlm_runs WHERE state = 'queued'), "
                "ins AS (INSERT INTO rlm_runs (run_id, owner, created_at, updated_at, state, summary, need, queued_at, "
                "  prefer_worker, prefer_until) "
                f"  SELECT %(run_id)s, %(owner)s, %(created_at)s, {NOW}, 'queued', %(summary)s, %(need)s, "
                "  clock_timestamp(), %(prefer)s, clock_timestamp() + make_interval(secs => %(prefer_s)s) FROM c WHERE c.total < %(max_total)s AND c.mine < %(max_mine)s RETURNING run_id) "
                "SELECT c.total, c.mine, (SELECT count(*) FROM ins) AS inserted, "
                "  (SELECT pg_notify(%(channel)s, 'queued') FROM ins) AS woken FROM c",
                {
                    "owner": owner,
                    "run_id": run_id,
                    "created_at": record.created_at,
                    "summary": _dump(record),
                    "need": max(1, need),
                    "max_total": settings.run_max_queued,
                    "max_mine": settings.run_max_queued_per_owner,
                    "channel": QUEUE_CHANNEL,
                    "prefer": prefer_worker,
                    "prefer_s": prefer_s if prefer_worker is not None else 0.0,
                },
            )
            row = await cur.fetchone()
        assert row is not None
        if not row["inserted"]:
            busy = queue_refusal(settings, queued=int(row["total"]), queued_by_owner=int(row["mine"]))
            assert busy is not None  # the statement's bounds are queue_refusal's
            raise busy

    async def read(self, run_id: str) -> RunRow | None:
        async with self._db.connection() as conn:
            cur = await conn.execute(f"SELECT {_COLUMNS} FROM rlm_runs WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
        return _row(row) if row is not None else None

    async def cancel(self, run_id: str, summary_if_queued: RunRecord) -> bool:
        """End a queued run with `summary_if_queued` (True), or ask the worker of a running one
        to cancel it (False: its worker writes the end)."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "WITH up AS (UPDATE rlm_runs SET state = 'done', summary = %s, updated_at = "
                f"{NOW} WHERE run_id = %s AND state = 'queued' RETURNING run_id) "
                "SELECT (SELECT count(*) FROM up) AS ended, pg_notify(%s, %s)",
                (_dump(summary_if_queued), run_id, CHANNEL, run_id),
            )
            row = await cur.fetchone()
            if row is not None and row["ended"]:
                return True
            await conn.execute(
                "WITH up AS (UPDATE rlm_runs SET cancel_requested = true WHERE run_id = %s AND state = 'running' "
                "RETURNING run_id) SELECT pg_notify(%s, 'cancel ' || run_id) FROM up",
                (run_id, QUEUE_CHANNEL),
            )
        return False

    async def queued_counts(self, owner: str) -> tuple[int, int]:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS total, count(*) FILTER (WHERE owner = %s) AS mine FROM rlm_runs WHERE state = 'queued'",
                (owner,),
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row["total"]), int(row["mine"])

    async def gauges(self) -> tuple[int, float, int]:
        """(runs queued, seconds the oldest has waited, live workers), in one statement."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS depth, coalesce(extract(epoch FROM now() - min(queued_at)), 0) AS oldest, "
                "(SELECT count(*) FROM rlm_workers WHERE gone_at IS NULL "
                " AND heartbeat_at > now() - make_interval(secs => %s)) AS alive "
                "FROM rlm_runs WHERE state = 'queued'",
                (self._lease,),
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row["depth"]), max(0.0, float(row["oldest"])), int(row["alive"])

    # --- workers' runs ----------------------------------------------------------------------

    async def claim(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, sessions: bool = True
    ) -> RunRow | None:
        """The next run for this worker (see the module's docstring), now `running` under a new
        attempt; None when no queued run fits. `sessions=False`: none of a kept session's runs
        (this worker's image cannot restore one)."""
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                "SELECT pg_advisory_xact_lock(%s), (SELECT coalesce(sum(slots), 0) FROM rlm_workers "
                "WHERE gone_at IS NULL AND heartbeat_at > now() - make_interval(secs => %s)) AS slots",
                (CLAIM_LOCK_KEY, self._lease),
            )
            live = await cur.fetchone()
            # Each owner's share of every live worker's run slots (the rule embedded mode applies
            # to its own slots); this worker is live, so there is at least one slot.
            share = owner_run_share(self._settings, slots=max(1, int(live["slots"]) if live else 1))
            cur = await conn.execute(
                "WITH busy AS (SELECT owner, count(*) AS n FROM rlm_runs WHERE state = 'running' GROUP BY owner), "
                "pick AS (SELECT r.run_id FROM rlm_runs r LEFT JOIN busy b ON b.owner = r.owner "
                "  WHERE r.state = 'queued' AND least(r.need, %(cap)s) <= %(free)s "
                "  AND coalesce(b.n, 0) < %(share)s "
                # A session's run names its session in the record's JSON (matched as text: a
                # summary may hold a NUL, which jsonb refuses; inside a string a quote is escaped).
                "  AND (%(sessions)s OR position(%(session_key)s in r.summary) = 0) "
                "  AND (r.prefer_worker IS NULL OR r.prefer_worker = %(worker)s OR r.prefer_until <= now() "
                "    OR NOT EXISTS (SELECT 1 FROM rlm_workers w WHERE w.worker_id = r.prefer_worker "
                "      AND w.gone_at IS NULL AND w.heartbeat_at > now() - make_interval(secs => %(lease)s))) "
                "  ORDER BY coalesce(b.n, 0), r.queued_at, r.run_id LIMIT 1 FOR UPDATE OF r SKIP LOCKED) "
                "UPDATE rlm_runs r SET state = 'running', attempt = r.attempt + 1, worker_id = %(worker)s, "
                f"  claimed_at = now(), cancel_requested = false, updated_at = {NOW} "
                f"FROM pick WHERE r.run_id = pick.run_id RETURNING {', '.join('r.' + c.strip() for c in _COLUMNS.split(','))}, "
                "extract(epoch FROM now() - r.queued_at) AS waited_s",
                {
                    "free": free_sandboxes,
                    "cap": max_sandboxes,
                    "share": share,
                    "worker": worker_id,
                    "lease": self._lease,
                    "sessions": sessions,
                    "session_key": '"session_id": "',
                },
            )
            row = await cur.fetchone()
        if row is None:
            return None
        metrics.claim_latency(float(row["waited_s"]))  # queued (or queued again) to claimed, both the database's clock
        return _row(row)

    async def cancels(self, worker_id: int) -> list[str]:
        """The runs this worker holds whose cancel was asked for."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT run_id FROM rlm_runs WHERE state = 'running' AND worker_id = %s AND cancel_requested",
                (worker_id,),
            )
            return [r["run_id"] for r in await cur.fetchall()]

    async def requeue(self, run_id: str, attempt: int, summary: RunRecord) -> bool:
        """Hand the run back to the queue (fenced); False when it is no longer this attempt's."""
        async with self._db.connection() as conn:
            return await self._requeue(conn, run_id, summary, attempt=attempt)

    async def _requeue(self, conn: Conn, run_id: str, summary: RunRecord, *, attempt: int | None) -> bool:
        fence = "" if attempt is None else " AND attempt = %s"
        params: tuple[Any, ...] = (_dump(summary), run_id) + (() if attempt is None else (attempt,))
        cur = await conn.execute(
            "WITH up AS (UPDATE rlm_runs SET state = 'queued', worker_id = NULL, requeues = requeues + 1, "
            f"summary = %s, queued_at = now(), updated_at = {NOW} WHERE run_id = %s AND state = 'running'{fence} "
            "RETURNING run_id) SELECT (SELECT count(*) FROM up) AS n, pg_notify(%s, %s), pg_notify(%s, 'queued')",
            (*params, CHANNEL, run_id, QUEUE_CHANNEL),
        )
        row = await cur.fetchone()
        return bool(row and row["n"])

    async def finish(self, run_id: str, summary: RunRecord, *, attempt: int | None = None) -> bool:
        """Write the final summary unless the run already ended (or, with `attempt`, is no longer
        that attempt's); True if this call ended it."""
        async with self._db.connection() as conn:
            return await self._finish(conn, run_id, summary, attempt=attempt)

    async def _finish(self, conn: Conn, run_id: str, summary: RunRecord, *, attempt: int | None) -> bool:
        fence = "state <> 'done'" if attempt is None else "state = 'running' AND attempt = %s"
        params: tuple[Any, ...] = (_dump(summary), run_id) + (() if attempt is None else (attempt,))
        cur = await conn.execute(
            f"WITH up AS (UPDATE rlm_runs SET summary = %s, state = 'done', updated_at = {NOW} "
            f"WHERE run_id = %s AND {fence} RETURNING run_id) SELECT (SELECT count(*) FROM up) AS ended, "
            "pg_notify(%s, %s)",
            (*params, CHANNEL, run_id),
        )
        row = await cur.fetchone()
        return bool(row and row["ended"])

    # --- sweepers ---------------------------------------------------------------------------

    async def lost_runs(self) -> list[str]:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT r.run_id FROM rlm_runs r LEFT JOIN rlm_workers w ON w.worker_id = r.worker_id "
                f"WHERE r.state = 'running' AND r.worker_id IS NOT NULL AND {_LOST} ORDER BY r.run_id",
                (self._lease,),
            )
            return [r["run_id"] for r in await cur.fetchall()]

    async def end_or_requeue_lost(self, run_id: str) -> str | None:
        """In its own transaction: a lost worker's run is queued again when it had no answered LM
        call and was never queued again before, else it ends `error` naming the worker. Returns
        "requeued", "ended", or None when another sweeper (or the worker) got there first."""
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                f"SELECT {', '.join('r.' + c.strip() for c in _COLUMNS.split(','))} FROM rlm_runs r "
                f"LEFT JOIN rlm_workers w ON w.worker_id = r.worker_id WHERE r.run_id = %s AND r.state = 'running' "
                f"AND {_LOST} FOR UPDATE OF r SKIP LOCKED",
                (run_id, self._lease),
            )
            found = await cur.fetchone()
            if found is None:
                return None
            row = _row(found)
            who = await self._worker_ref(conn, row.worker_id)
            if not row.lm_called and row.requeues == 0:
                notice = Notice(kind=NoticeKind.REQUEUED_WORKER_LOST, worker=who)
                summary = RunRecord.from_stored(row.summary).model_copy(
                    update={"status": "queued", "phase": RunPhase.QUEUED, "notice": notice}
                )
                await self._requeue(conn, run_id, summary, attempt=row.attempt)
                log.warning("run %s: %s lost before its first LM call; queued again", run_id, who.render())
                return "requeued"
            lost = Notice(kind=NoticeKind.WORKER_LOST, worker=who, lease_s=self._lease)
            await self._finish(conn, run_id, final_summary(row.summary, "error", lost), attempt=row.attempt)
            log.warning("run %s ended: %s lost", run_id, who.render())
            return "ended"

    async def stale_queued(self) -> list[str]:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT run_id FROM rlm_runs WHERE state = 'queued' "
                "AND queued_at < now() - make_interval(secs => %s) ORDER BY queued_at",
                (self._settings.run_queue_timeout_s,),
            )
            return [r["run_id"] for r in await cur.fetchall()]

    async def time_out(self, run_id: str, reason: str) -> bool:
        """In its own transaction: end a run still queued past the queue timeout."""
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                "SELECT summary FROM rlm_runs WHERE run_id = %s AND state = 'queued' "
                "AND queued_at < now() - make_interval(secs => %s) FOR UPDATE SKIP LOCKED",
                (run_id, self._settings.run_queue_timeout_s),
            )
            row = await cur.fetchone()
            if row is None:
                return False
            summary = final_summary(json.loads(row["summary"]), "error", reason)
            return await self._finish(conn, run_id, summary, attempt=None)
