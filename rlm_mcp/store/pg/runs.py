"""Run records in PostgreSQL (team mode): one `rlm_runs` row per run id (owner, summary, done)
and its events as `rlm_run_events` rows ordered by a per-run sequence, so any replica lists,
shows and renders any finished run.

Each event is stored as the one JSON line the file store would write (`events.to_json`, then
`encode_event`'s caps) and read back with `events.loads`, so this store knows no event type;
the same caps apply (one event, the whole log).
"""

from __future__ import annotations

import builtins
import json
import logging

from rlm_mcp.errors import BadArgumentError
from rlm_mcp.events import EventKey, LoggedEvent, loads
from rlm_mcp.owners import EVERY_OWNER, OwnerScope, sees
from rlm_mcp.ports.queue import RunRow, shown
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store.pg import queue_statements as queue_sql
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.log_writer import PgLogWriter
from rlm_mcp.store.pg.run_log import PgRunLog, dump_record
from rlm_mcp.store.runs import MAX_EVENT_BYTES, MAX_LOG_BYTES, check_run_id, unknown_run

log = logging.getLogger("rlm_mcp.store")

# What a record's reader reads: its summary, with the state and worker that `ports.queue.shown`
# reads it by (a claimed run shows as running before its worker's first live summary).
_SHOWN = "summary, state, worker_id"


def _shown(row: dict[str, object]) -> RunRecord:
    record = RunRecord.from_stored(json.loads(str(row["summary"])))
    worker_id = row["worker_id"]
    return shown(record, str(row["state"]), worker_id if isinstance(worker_id, int) else None)


class PgRunStore:
    def __init__(
        self,
        db: Database,
        *,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_log_bytes: int = MAX_LOG_BYTES,
    ) -> None:
        self._db = db
        self._writer = PgLogWriter(db)  # one per process: its runs' flushes batched
        self._max_event = max_event_bytes
        self._max_log = max_log_bytes

    async def create(self, record: RunRecord) -> PgRunLog:
        run_id = check_run_id(record.run_id)
        created_at = record.created_at
        async with self._db.connection() as conn:
            cur = await conn.execute(
                queue_sql.CREATE_LOCAL_RUN,
                (
                    run_id,
                    str(record.request.owner),
                    created_at,
                    queue_sql.local_state(record.done),
                    dump_record(record),
                ),
            )
            if await cur.fetchone() is None:
                raise BadArgumentError(f"Run id '{run_id}' already exists.", "Use a new, unique run id.")
        return PgRunLog(
            self._db, run_id, created_at=created_at, max_event_bytes=self._max_event, max_log_bytes=self._max_log
        )

    async def reopen(self, run_id: str, *, attempt: int | None = None) -> PgRunLog:
        """The log of a run created elsewhere (a team-mode worker executes a queued run under
        `attempt`, the claim's): appends go on after the events already there."""
        check_run_id(run_id)
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT created_at, next_seq, log_bytes FROM rlm_runs WHERE run_id = %s", (run_id,)
            )
            row = await cur.fetchone()
        if row is None:
            raise unknown_run(run_id)
        log = PgRunLog(
            self._db,
            run_id,
            created_at=row["created_at"],
            max_event_bytes=self._max_event,
            max_log_bytes=self._max_log,
            attempt=attempt,
            writer=self._writer,
        )
        log.resume(int(row["next_seq"]), int(row["log_bytes"]))
        return log

    def reopen_claimed(self, row: RunRow) -> PgRunLog:
        """`reopen(row.run_id, attempt=row.attempt)` from the claim's row (`queue_statements.CLAIM`
        returns the run's `next_seq`, `log_bytes` and `created_at`, read under the claim's row
        lock): no statement. Nothing can have moved them since: an earlier attempt's writes are
        fenced off by the claim, and this attempt has written nothing yet."""
        check_run_id(row.run_id)
        log = PgRunLog(
            self._db,
            row.run_id,
            created_at=row.created_at,
            max_event_bytes=self._max_event,
            max_log_bytes=self._max_log,
            attempt=row.attempt,
            writer=self._writer,
        )
        log.resume(row.next_seq, row.log_bytes)
        return log

    async def read_summary(self, run_id: str, *, owner: OwnerScope) -> RunRecord:
        check_run_id(run_id)
        async with self._db.connection() as conn:
            cur = await conn.execute(f"SELECT owner, {_SHOWN} FROM rlm_runs WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
        if row is None or not sees(owner, row["owner"]):
            raise unknown_run(run_id)
        return _shown(row)

    async def read_events(
        self, run_id: str, *, owner: OwnerScope, limit_bytes: int | None = None
    ) -> builtins.list[LoggedEvent]:
        await self.read_summary(run_id, owner=owner)
        events: list[LoggedEvent] = []
        used = 0
        async with self._db.connection() as conn:
            cur = conn.cursor()
            async for row in cur.stream(
                "SELECT seq, line FROM rlm_run_events WHERE run_id = %s ORDER BY seq, attempt", (run_id,)
            ):
                size = len(row["line"].encode()) + 1
                if limit_bytes is not None and used + size > limit_bytes:
                    break
                used += size
                try:
                    events.append(loads(row["line"]))  # another version's line: an UnreadableEvent
                except ValueError:  # not JSON: skipped, as the file store skips a malformed line
                    log.warning("skipping a malformed event line of run %s (seq %s)", run_id, row["seq"])
        return events

    async def events_after(
        self, run_id: str, *, owner: OwnerScope, after: EventKey | None, limit: int
    ) -> builtins.list[tuple[EventKey, LoggedEvent]]:
        """Events after `after` by (attempt, seq): an attempt's rows follow every earlier
        attempt's (a requeued run's next claim goes on from the sequence its log had reached,
        and a former attempt's worker writes nothing more: `EVENTS_FENCE`)."""
        await self.read_summary(run_id, owner=owner)
        start = after if after is not None else EventKey(-1, -1)
        found: list[tuple[EventKey, LoggedEvent]] = []
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT attempt, seq, line FROM rlm_run_events WHERE run_id = %s AND (attempt, seq) > (%s, %s) "
                "ORDER BY attempt, seq LIMIT %s",
                (run_id, start.attempt, start.seq, max(0, limit)),
            )
            for row in await cur.fetchall():
                try:
                    found.append((EventKey(int(row["attempt"]), int(row["seq"])), loads(row["line"])))
                except ValueError:  # not JSON: skipped, as read_events does
                    log.warning("skipping a malformed event line of run %s (seq %s)", run_id, row["seq"])
        return found

    async def version(self, run_id: str) -> str:
        check_run_id(run_id)
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT log_bytes, updated_at FROM rlm_runs WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
        if row is None:
            raise unknown_run(run_id)
        return f"{row['log_bytes']}-{row['updated_at']!r}"

    async def prune(self, *, max_records: int, max_age_days: float) -> builtins.list[str]:
        """Remove old records, aged by the database's clock (a replica whose own clock is ahead
        must not remove records the others still keep, let alone live runs): finished runs, and
        runs a process executed outside the team queue whose server stopped before ending them
        (no worker holds them); never a queued run or a run a worker holds."""
        removed: list[str] = []
        async with self._db.transaction() as conn:
            if max_age_days > 0:
                cur = await conn.execute(
                    "DELETE FROM rlm_runs WHERE (state = 'done' OR (state = 'running' AND worker_id IS NULL)) "
                    "AND updated_at < extract(epoch FROM now()) - %s "
                    "RETURNING run_id",
                    (max_age_days * 86400,),
                )
                removed += [r["run_id"] for r in await cur.fetchall()]
            # Per owner, as the file store does: one owner's many runs never remove another's.
            cur = await conn.execute(
                "DELETE FROM rlm_runs WHERE run_id IN (SELECT run_id FROM (SELECT run_id, row_number() OVER "
                "(PARTITION BY owner ORDER BY updated_at DESC) AS n FROM rlm_runs WHERE done) ranked WHERE n > %s) "
                "RETURNING run_id",
                (max(0, max_records),),
            )
            removed += [r["run_id"] for r in await cur.fetchall()]
        if removed:
            log.info("pruned %d old run record(s)", len(removed))
        return removed

    async def list(self, limit: int = 50, *, owner: OwnerScope) -> builtins.list[RunRecord]:
        async with self._db.connection() as conn:
            if owner is EVERY_OWNER:
                cur = await conn.execute(
                    f"SELECT {_SHOWN} FROM rlm_runs ORDER BY created_at DESC LIMIT %s", (max(0, limit),)
                )
            else:
                cur = await conn.execute(
                    f"SELECT {_SHOWN} FROM rlm_runs WHERE owner = %s ORDER BY created_at DESC LIMIT %s",
                    (owner, max(0, limit)),
                )
            rows = await cur.fetchall()
        records = []
        for r in rows:
            try:
                records.append(_shown(r))
            except ValueError as exc:  # not a run record (edited by hand): skipped, as the file store does
                log.warning("skipping an unreadable run record: %s", exc)
        return records
