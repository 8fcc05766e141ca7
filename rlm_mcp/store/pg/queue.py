"""`ports.queue.RunQueuePort` on PostgreSQL: every operation on team-mode run state; the worker
operations it inherits are in `workers.py`, every statement in `queue_statements.py`.

A run's row in `rlm_runs` is its one state machine (drawn in `ports/queue.py` and
docs/architecture.md); `rlm_workers` holds the workers. How the rules hold across replicas:

- Claims (`claim_many`): one transaction under an advisory lock, so the per-owner share and the
  order are exact across workers; it takes up to a limit of runs (as many claims one after
  another would), bumps each one's `attempt` and names the worker. One round trip: the BEGIN,
  the lock, the claim and the COMMIT together (`one_trip.locked_in_one_trip`), the share applied
  to the live slots the previous claim found and checked under the lock (a second trip when they
  changed).
- Fencing: a worker's writes (`requeue`, `finish` with `attempt`, and its run log's flushes,
  `run_log.PgRunLog`) match `(run_id, attempt, state = 'running')`; False means the run is no
  longer this worker's.
- The waiting bound (`enqueue`): counted and inserted under an advisory lock in one statement
  (the schema's `rlm_enqueue`, whose statements each take their own snapshot), so concurrent
  starts on any number of replicas never overshoot it; the run's contexts are checked to be its
  owner's in the same call.
- Sweeps: each lost run and each timed-out queued run in its own transaction, its row locked
  with SKIP LOCKED and its condition checked again, so concurrent sweepers act once, and one
  run's failure never stops the others.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from rlm_mcp.observability import metrics
from rlm_mcp.ports.queue import ClaimPins, QueueRules, RunRow, RunState
from rlm_mcp.ports.runs import Notice, NoticeKind, RunPhase, RunRecord, may_requeue
from rlm_mcp.store.context_model import PIN_TTL_S
from rlm_mcp.store.contexts import unknown_context
from rlm_mcp.store.pg import queue_statements as sql
from rlm_mcp.store.pg.db import Conn, Database
from rlm_mcp.store.pg.locks import CLAIM_LOCK_KEY, ENQUEUE_LOCK_KEY
from rlm_mcp.store.pg.one_trip import locked_in_one_trip
from rlm_mcp.store.pg.run_log import dump_record
from rlm_mcp.store.pg.workers import PgWorkerRegistry

__all__ = ["PgRunQueue"]

log = logging.getLogger("rlm_mcp.queue")


def _record(row: dict[str, Any]) -> RunRecord:
    """The row's record; the row's own run id where the stored JSON lacks one (a former
    release's row: the id column is the run's)."""
    stored = json.loads(row["summary"])
    if isinstance(stored, dict):
        stored.setdefault("run_id", row["run_id"])
    return RunRecord.from_stored(stored)


def _row(row: dict[str, Any]) -> RunRow:
    return RunRow(
        run_id=row["run_id"],
        owner=row["owner"],
        state=RunState(row["state"]),
        attempt=int(row["attempt"]),
        summary=_record(row),
        worker_id=row["worker_id"],
        lm_called=bool(row["lm_called"]),
        requeues=int(row["requeues"]),
        next_seq=int(row["next_seq"]),
        log_bytes=int(row["log_bytes"]),
        created_at=float(row["created_at"]),
        cancel_requested=bool(row["cancel_requested"]),
        followed=bool(row["followed"]),
        pins=_claim_pins(row),
    )


def _claim_pins(row: dict[str, Any]) -> ClaimPins | None:
    """The contexts a claim pinned for the run (`queue_statements.CLAIM`'s `contexts`)."""
    contexts = row.get("contexts")
    if contexts is None:
        return None
    return ClaimPins(str(row["pin_id"]), tuple(contexts))


# A claim whose live slots changed is tried again with the share of the new count; a team whose
# workers come and go faster than that claims nothing this time, and again at the next look.
CLAIM_TRIES = 3


class PgRunQueue(PgWorkerRegistry):
    """The run statements here, the worker statements from `workers.PgWorkerRegistry`."""

    def __init__(self, rules: QueueRules, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(rules, db, clock=clock)
        self._live_slots = -1  # the live workers' run slots at the last claim (none yet: never a count)

    # --- fronts -----------------------------------------------------------------------------

    async def enqueue(
        self,
        record: RunRecord,
        need: int,
        *,
        prefer_worker: int | None = None,
        prefer_s: float = 0.0,
        wake_workers: bool = True,
    ) -> None:
        """Insert the queued run unless its owner holds no context by one of those its request
        names (the unknown-context error of `Contexts.get`) or a waiting bound is reached
        (`BusyError`), and
        wake the workers. Checked, counted and inserted under one lock in one statement
        (`queue_statements.ENQUEUE`): concurrent starts never overshoot.
        `prefer_worker`: for `prefer_s` seconds only that worker may claim the run (a kept
        session's follow-up waits for the worker that holds its live sandbox), unless it is lost."""
        rules = self._rules
        async with self._db.connection() as conn:  # autocommit: the call is its own transaction
            cur = await conn.execute(
                sql.ENQUEUE,
                {
                    "key": ENQUEUE_LOCK_KEY,
                    "owner": str(record.request.owner),
                    "run_id": record.run_id,
                    "created_at": record.created_at,
                    "summary": dump_record(record),
                    "need": max(1, need),
                    "max_total": rules.max_queued,
                    "max_mine": rules.max_queued_per_owner,
                    # No channel: no NOTIFY (migration 0012); the local lane's worker is woken in-process.
                    "queue_channel": sql.QUEUE_CHANNEL if wake_workers else None,
                    "prefer": prefer_worker,
                    "prefer_s": prefer_s if prefer_worker is not None else 0.0,
                    "contexts": list(record.request.context_ids),
                },
            )
            row = await cur.fetchone()
        assert row is not None
        if row["missing"] is not None:
            raise unknown_context(row["missing"])
        if not row["inserted"]:
            busy = rules.refusal(int(row["total"]), int(row["mine"]))
            assert busy is not None  # the statement's bounds are the refusal's
            raise busy

    async def wake_workers(self) -> None:
        async with self._db.connection() as conn:
            await conn.execute(sql.NOTIFY_QUEUED, {"queue_channel": sql.QUEUE_CHANNEL})

    async def read(self, run_id: str) -> RunRow | None:
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.READ_RUN, {"run_id": run_id})
            row = await cur.fetchone()
        return _row(row) if row is not None else None

    async def cancel(self, run_id: str, summary_if_queued: RunRecord) -> bool:
        """End a queued run with `summary_if_queued` (True), or ask the worker of a running one
        to cancel it (False: its worker writes the end)."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                sql.CANCEL_QUEUED,
                {"summary": dump_record(summary_if_queued), "run_id": run_id, "channel": sql.run_channel(run_id)},
            )
            row = await cur.fetchone()
            if row is not None and row["ended"]:
                return True
            await conn.execute(sql.ASK_CANCEL, {"run_id": run_id, "queue_channel": sql.QUEUE_CHANNEL})
        return False

    async def follow_progress(self, run_id: str) -> None:
        """Mark the run followed (its claim reads the mark) and tell a running run's worker
        (`queue_statements.FOLLOW`); nothing for a run already marked or ended."""
        async with self._db.connection() as conn:
            await conn.execute(sql.FOLLOW, {"run_id": run_id, "queue_channel": sql.QUEUE_CHANNEL})

    async def queued_counts(self, owner: str) -> tuple[int, int]:
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.QUEUED_COUNTS, {"owner": owner})
            row = await cur.fetchone()
        assert row is not None
        return int(row["total"]), int(row["mine"])

    async def gauges(self) -> tuple[int, float, int]:
        """(runs queued, seconds the oldest has waited, live workers), in one statement."""
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.GAUGES, {"lease": self._lease})
            row = await cur.fetchone()
        assert row is not None
        return int(row["depth"]), max(0.0, float(row["oldest"])), int(row["alive"])

    # --- workers' runs ----------------------------------------------------------------------

    async def any_queued(self) -> bool:
        """One statement, no claim lock (`claim`'s transaction is four statements and the
        team-wide lock): an idle worker's timed look. Nothing is missed: a run queued after it
        announces itself ("queued"), and the worker clears its wake-up before it looks."""
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.ANY_QUEUED)
            found = await cur.fetchone()
        return found is not None and bool(found["any"])

    async def claim(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, sessions: bool = True
    ) -> RunRow | None:
        """The next run for this worker (`claim_many` with a limit of one)."""
        rows = await self.claim_many(worker_id, free_sandboxes, max_sandboxes, limit=1, sessions=sessions)
        return rows[0] if rows else None

    async def claim_many(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, limit: int, sessions: bool = True
    ) -> list[RunRow]:
        """Up to `limit` runs for this worker (`queue_statements.CLAIM`), each now `running` under a
        new attempt of its own, in the order one claim after another would take them; empty when
        no queued run fits. `sessions=False`: none of a kept session's runs (this worker's image
        cannot restore one)."""
        # The share is of the live workers' run slots, as the last claim found them: the claim
        # checks them under its lock and claims nothing when they changed, but says how many they
        # are now, so a second claim applies the share to those (`queue_statements.CLAIM`).
        rows: list[dict[str, Any]] = []
        for _ in range(CLAIM_TRIES):
            for_slots = self._live_slots
            async with self._db.connection() as conn:
                found = await locked_in_one_trip(
                    conn,
                    sql.CLAIM_LOCK,
                    {"key": CLAIM_LOCK_KEY},
                    sql.CLAIM,
                    {
                        "free": free_sandboxes,
                        "cap": max_sandboxes,
                        # Each owner's share of every live worker's run slots (the rule embedded
                        # mode applies to its own slots); this worker is live, so there is at
                        # least one slot.
                        "share": self._rules.share(max(1, for_slots)),
                        "for_slots": for_slots,
                        "worker": worker_id,
                        "lease": self._lease,
                        "sessions": sessions,
                        "session_key": sql.SESSION_KEY,
                        "limit": max(1, limit),
                        "replica": self._db.replica_id,
                        "ttl": PIN_TTL_S,
                    },
                )
            self._live_slots = int(found[0]["live_slots"])
            rows = [row for row in found if row["run_id"] is not None]
            if rows or self._live_slots == for_slots:  # (the check claims nothing when they differ)
                break
        for row in rows:
            metrics.claim_latency(float(row["waited_s"]))  # queued (or queued again) to claimed, the database's clock
        return [_row(row) for row in rows]

    async def cancels(self, worker_id: int) -> list[str]:
        """The runs this worker holds whose cancel was asked for."""
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.CANCELS, {"worker": worker_id})
            return [r["run_id"] for r in await cur.fetchall()]

    async def followed(self, worker_id: int) -> list[str]:
        """The runs this worker holds that a front follows."""
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.FOLLOWED, {"worker": worker_id})
            return [r["run_id"] for r in await cur.fetchall()]

    async def requeue(self, run_id: str, attempt: int, summary: RunRecord) -> bool:
        """Hand the run back to the queue (fenced); False when it is no longer this attempt's."""
        async with self._db.connection() as conn:
            return await self._requeue(conn, run_id, summary, attempt=attempt)

    async def _requeue(self, conn: Conn, run_id: str, summary: RunRecord, *, attempt: int) -> bool:
        cur = await conn.execute(
            sql.REQUEUE,
            {
                "summary": dump_record(summary),
                "run_id": run_id,
                "attempt": attempt,
                "channel": sql.run_channel(run_id),
                "queue_channel": sql.QUEUE_CHANNEL,
            },
        )
        row = await cur.fetchone()
        return bool(row and row["n"])

    async def finish(self, run_id: str, summary: RunRecord, *, attempt: int | None = None) -> bool:
        """Write the final summary unless the run already ended (or, with `attempt`, is no longer
        that attempt's); True if this call ended it."""
        async with self._db.connection() as conn:
            return await self._finish(conn, run_id, summary, attempt=attempt)

    async def _finish(self, conn: Conn, run_id: str, summary: RunRecord, *, attempt: int | None) -> bool:
        params = {
            "summary": dump_record(summary),
            "run_id": run_id,
            "attempt": attempt,
            "channel": sql.run_channel(run_id),
        }
        cur = await conn.execute(sql.FINISH_ANY if attempt is None else sql.FINISH_ATTEMPT, params)
        row = await cur.fetchone()
        return bool(row and row["ended"])

    # --- sweepers ---------------------------------------------------------------------------

    async def end_or_requeue_lost(self, run_id: str) -> str | None:
        """In its own transaction: a lost worker's run is queued again when it had no answered LM
        call and was never queued again before, else it ends `error` naming the worker. Returns
        "requeued", "ended", or None when another sweeper (or the worker) got there first."""
        async with self._db.transaction() as conn:
            cur = await conn.execute(sql.LOST_RUN_LOCKED, {"run_id": run_id, "lease": self._lease})
            found = await cur.fetchone()
            if found is None:
                return None
            row = _row(found)
            who = await self._worker_ref(conn, row.worker_id)
            if may_requeue(lm_called=row.lm_called, requeues=row.requeues):
                notice = Notice(kind=NoticeKind.REQUEUED_WORKER_LOST, worker=who)
                summary = row.summary.model_copy(
                    update={"status": "queued", "phase": RunPhase.QUEUED, "notice": notice}
                )
                await self._requeue(conn, run_id, summary, attempt=row.attempt)
                log.warning("run %s: %s lost before its first LM call; queued again", run_id, who.render())
                return "requeued"
            lost = Notice(kind=NoticeKind.WORKER_LOST, worker=who, lease_s=self._lease)
            await self._finish(
                conn, run_id, row.summary.ended("error", lost.render(), notice=lost), attempt=row.attempt
            )
            log.warning("run %s ended: %s lost", run_id, who.render())
            return "ended"

    async def stale_queued(self) -> list[str]:
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.STALE_QUEUED, {"timeout": self._rules.queue_timeout_s})
            return [r["run_id"] for r in await cur.fetchall()]

    async def time_out(self, run_id: str, reason: str) -> bool:
        """In its own transaction: end a run still queued past the queue timeout."""
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                sql.STALE_QUEUED_LOCKED, {"run_id": run_id, "timeout": self._rules.queue_timeout_s}
            )
            row = await cur.fetchone()
            if row is None:
                return False
            summary = _record(row).ended("error", reason)
            return await self._finish(conn, run_id, summary, attempt=None)
