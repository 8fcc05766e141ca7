"""The run queue's reads and writes of rlm-mcp's own tables (`rlm_runs`, `rlm_workers`).

A run's record is its truth for every replica: the worker that runs it rewrites the summary on
each progress event (with the run's staged events, in one statement: `runlog.QueueRunLog`) and at
the end, and every write comes with a NOTIFY on `CHANNEL` whose payload is the run id only (NOTIFY payloads are capped at 8 kB; the waiter reads the row). Final
writes are conditional (`NOT done`), so two processes that both end a run (a cancel of a queued
run, a sweeper, the worker) cannot overwrite each other's verdict.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from rlm_mcp.ports.runs import Notice, RunRecord, RunStatus, WorkerRef
from rlm_mcp.store.pg.db import Conn, Database

CHANNEL = "rlm_run_progress"


@dataclass
class RunRow:
    run_id: str
    owner: str
    done: bool
    summary: dict[str, Any]
    job_id: int | None
    worker_id: int | None
    lm_called: bool
    requeues: int
    next_seq: int
    created_at: float

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRow:
        return cls(
            run_id=row["run_id"],
            owner=row["owner"],
            done=bool(row["done"]),
            summary=json.loads(row["summary"]),
            job_id=row["job_id"],
            worker_id=row["worker_id"],
            lm_called=bool(row["lm_called"]),
            requeues=int(row["requeues"]),
            next_seq=int(row["next_seq"]),
            created_at=float(row["created_at"]),
        )


_COLUMNS = "run_id, owner, done, summary, job_id, worker_id, lm_called, requeues, next_seq, created_at"


def _dump(record: RunRecord) -> str:
    return json.dumps(record.to_stored(), ensure_ascii=False)


async def read(db: Database, run_id: str) -> RunRow | None:
    async with db.connection() as conn:
        cur = await conn.execute(f"SELECT {_COLUMNS} FROM rlm_runs WHERE run_id = %s", (run_id,))
        row = await cur.fetchone()
    return RunRow.from_row(row) if row is not None else None


async def had_lm_reply(db: Database, run_id: str) -> bool:
    """Whether the run's log holds an answered LM call. Exact where the published `lm_called`
    flag may lag: the engine awaits the first answered `llm_call` event's row (written with the
    flag, `runlog.QueueRunLog`) before it runs any code."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM rlm_run_events WHERE run_id = %s AND line::jsonb ->> 'type' = 'llm_call' "
            "AND line::jsonb ->> 'error' IS NULL) AS replied",
            (run_id,),
        )
        row = await cur.fetchone()
    return bool(row and row["replied"])


async def set_job(db: Database, run_id: str, job_id: int) -> None:
    async with db.connection() as conn:
        await conn.execute("UPDATE rlm_runs SET job_id = %s WHERE run_id = %s", (job_id, run_id))


async def claim(db: Database, run_id: str, worker_id: int) -> RunRow | None:
    """Name the worker on the run; None when the run already ended (cancelled while queued)."""
    async with db.connection() as conn:
        cur = await conn.execute(
            f"UPDATE rlm_runs SET worker_id = %s, updated_at = %s WHERE run_id = %s AND NOT done RETURNING {_COLUMNS}",
            (worker_id, time.time(), run_id),
        )
        row = await cur.fetchone()
    return RunRow.from_row(row) if row is not None else None


async def finish(db: Database, run_id: str, summary: RunRecord, *, conn: Conn | None = None) -> bool:
    """Write the final summary unless another process already did; True if this one did."""
    if conn is None:
        async with db.connection() as own:
            return await finish(db, run_id, summary, conn=own)
    cur = await conn.execute(
        "WITH up AS (UPDATE rlm_runs SET summary = %s, done = true, updated_at = %s WHERE run_id = %s AND NOT done "
        "RETURNING run_id) SELECT (SELECT count(*) FROM up) AS ended, pg_notify(%s, %s)",
        (_dump(summary), time.time(), run_id, CHANNEL, run_id),
    )
    row = await cur.fetchone()
    return bool(row and row["ended"])


async def requeue(db: Database, run_id: str, summary: RunRecord) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "WITH up AS (UPDATE rlm_runs SET summary = %s, worker_id = NULL, requeues = requeues + 1, updated_at = %s "
            "WHERE run_id = %s AND NOT done) SELECT pg_notify(%s, %s)",
            (_dump(summary), time.time(), run_id, CHANNEL, run_id),
        )


async def register_worker(db: Database, worker_id: int, owner_id: str) -> None:
    async with db.connection() as conn:
        # This owner's earlier registrations (declared lost during an outage) are over: their
        # sandboxes are this process's own and must not be reaped as a lost worker's.
        await conn.execute(
            "UPDATE rlm_workers SET gone_at = %s WHERE owner_id = %s AND gone_at IS NULL", (time.time(), owner_id)
        )
        await conn.execute(
            "INSERT INTO rlm_workers (worker_id, owner_id, host, pid, started_at) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (worker_id) DO NOTHING",
            (worker_id, owner_id, socket.gethostname(), os.getpid(), time.time()),
        )


async def worker_ref(db: Database, worker_id: int | None) -> WorkerRef:
    """A worker as notices name it: its id, host and pid (its id alone when its row is gone)."""
    if worker_id is None:
        return WorkerRef()
    async with db.connection() as conn:
        cur = await conn.execute("SELECT host, pid FROM rlm_workers WHERE worker_id = %s", (worker_id,))
        row = await cur.fetchone()
    if row is None:
        return WorkerRef(worker_id=worker_id)
    return WorkerRef(worker_id=worker_id, host=row["host"], pid=row["pid"])


async def queued_counts(db: Database, owner: str) -> tuple[int, int]:
    """Runs waiting for a worker: all owners, and `owner`'s."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS total, count(*) FILTER (WHERE r.owner = %s) AS mine "
            "FROM procrastinate_jobs j JOIN rlm_runs r ON r.job_id = j.id WHERE j.status = 'todo'",
            (owner,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["total"]), int(row["mine"])


async def live_workers(db: Database, lease_s: float) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM procrastinate_workers WHERE last_heartbeat > now() - make_interval(secs => %s)",
            (lease_s,),
        )
        row = await cur.fetchone()
    return int(row["n"]) if row else 0


def final_summary(summary: dict[str, Any], status: RunStatus, reason: str | Notice) -> RunRecord:
    """A run's last stored record turned final, for a run that ends without its worker."""
    notice = reason if isinstance(reason, Notice) else None
    text = reason.render() if isinstance(reason, Notice) else reason
    return RunRecord.from_stored(summary).ended(status, text, notice=notice)
