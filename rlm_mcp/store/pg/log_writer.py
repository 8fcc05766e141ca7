"""A worker process's one writer of its runs' log flushes (team mode): the pending flushes of all
its runs in one statement (group commit).

Each `PgRunLog` of a claimed run (an attempt) hands its flush here (`LogFlush`: its staged rows,
its counters, the optional live summary, the `lm_called` mark and the wake-up) and waits for its
own answer. When no write is in flight, the caller writes at once, with every flush asked in the
same pass of the event loop (runs whose periodic publishes come due at the same tick of the
process's clock, `rlm_mcp.ticks`); a flush asked while a write is in flight joins the next one,
which starts as soon as that write ends. Nothing waits for a timer.

Every guarantee is per run, as with a statement of its own (`BATCH_FLUSH`): a former attempt's
rows land nothing and its summary is not written (the fence is the run's attempt and `running`
state, row by row); a summary never lands over a final one; a run's rows are written in their
order with no row twice on a retry; a run whose record was pruned writes nothing without failing
the others (its events are inserted only for records the statement has locked, not left to the
foreign key); each run's NOTIFY carries its own payload. A failed statement fails every flush in
it (the database away), whose rows stay staged for their next try; a failure of one run's own
values fails that run's flush alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import psycopg

from rlm_mcp.errors import StoreUnreachableError
from rlm_mcp.store.pg import queue_statements as queue_sql
from rlm_mcp.store.pg.db import Database

# The batch as a table `b` (one row a run, numbered `i`), the records still this attempt's and
# running locked (`r`: each one's key cannot go away before the events land), the events of those
# runs, the records' counters, summaries and marks, then each run's answer and wake-up. The
# update reads `r`, so the records are locked before any is updated (a record this statement had
# updated first would not be locked, nor its events written).
BATCH_FLUSH = (
    "WITH b AS (SELECT * FROM unnest(%b::text[], %b::integer[], %b::bigint[], %b::bigint[], %b::bigint[], "
    "%b::bigint[], %b::text[], %b::boolean[], %b::boolean[], %b::boolean[], %b::text[], %b::text[]) WITH ORDINALITY "
    "AS b (run_id, attempt, first_seq, first_row, next_seq, log_bytes, summary, done, mark, announce, channel, "
    "payload, i)), "
    "r AS (SELECT x.run_id, x.attempt FROM rlm_runs x JOIN b ON x.run_id = b.run_id "
    "WHERE x.attempt = b.attempt AND x.state = 'running' ORDER BY x.run_id FOR KEY SHARE OF x), "
    "ev AS (INSERT INTO rlm_run_events (run_id, attempt, seq, line) "
    "SELECT b.run_id, b.attempt, b.first_seq + v.n - b.first_row, v.line "
    "FROM unnest(%b::text[], %b::bigint[]) WITH ORDINALITY AS v (line, bi, n) JOIN b ON b.i = v.bi "
    "WHERE (b.run_id, b.attempt) IN (SELECT run_id, attempt FROM r) ON CONFLICT DO NOTHING), "
    "up AS (UPDATE rlm_runs x SET updated_at = extract(epoch FROM clock_timestamp()), "
    "next_seq = GREATEST(x.next_seq, b.next_seq), log_bytes = GREATEST(x.log_bytes, b.log_bytes), "
    f"{queue_sql.BATCH_SET_SUMMARY}, lm_called = x.lm_called OR b.mark "
    "FROM b JOIN r ON r.run_id = b.run_id AND r.attempt = b.attempt "
    "WHERE x.run_id = b.run_id AND x.attempt = b.attempt AND x.state = 'running' "
    "RETURNING x.run_id, x.attempt, x.done) "
    "SELECT b.i, s.live, CASE WHEN b.announce THEN pg_notify(b.channel, CASE WHEN s.live THEN b.payload "
    "ELSE b.run_id END) END AS notified FROM b CROSS JOIN LATERAL (SELECT coalesce((SELECT NOT up.done FROM up "
    "WHERE up.run_id = b.run_id AND up.attempt = b.attempt), false) AS live) AS s ORDER BY b.i"
)


@dataclass(eq=False)
class LogFlush:
    """One run's flush, as `PgRunLog.flush` hands it over: its staged lines (consecutive
    sequences from `first_seq`), its counters, the stored summary (None: no summary), whether it
    is final, the mark, whether to announce, its channel and the live payload."""

    run_id: str
    attempt: int
    first_seq: int
    lines: list[str]
    next_seq: int
    log_bytes: int
    summary: str | None
    done: bool
    mark: bool
    announce: bool
    channel: str
    payload: str
    live: bool | None = None  # the answer, once written
    error: BaseException | None = None  # the statement's failure, once failed
    wake: anyio.Event = field(default_factory=anyio.Event)

    @property
    def settled(self) -> bool:
        return self.live is not None or self.error is not None


class PgLogWriter:
    """The process's writer of its runs' log flushes: one statement in flight at a time, carrying
    every flush pending when it starts."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._pending: list[LogFlush] = []
        self._writing = False

    async def write(self, flush: LogFlush) -> bool:
        """Write `flush` with whatever else is pending; True while its run is live and this
        attempt's (as `PgRunLog.flush`). Raises the statement's error when it failed."""
        self._pending.append(flush)
        try:
            while not flush.settled:
                if self._writing:
                    await flush.wake.wait()
                    flush.wake = anyio.Event()
                    continue
                await self._lead()
        finally:
            if not flush.settled and flush in self._pending:  # cancelled while waiting
                self._pending.remove(flush)
                if not self._writing and self._pending:  # it may have been the next to lead
                    self._pending[0].wake.set()
        if flush.error is not None:
            raise flush.error
        return bool(flush.live)

    async def _lead(self) -> None:
        """Write everything pending, in one statement; then wake the next pending flush to lead."""
        self._writing = True
        batch: list[LogFlush] = []
        try:
            # Flushes asked in this same pass of the event loop (publishes due at one tick) join.
            await anyio.lowlevel.checkpoint()
            batch, self._pending = self._pending, []
            for flush, answer in zip(batch, await self._statement(batch), strict=True):
                if isinstance(answer, bool):
                    flush.live = answer
                else:
                    flush.error = answer
        except Exception as exc:  # every flush of the batch failed (the database is away): its rows stay staged
            for flush in batch:
                flush.error = exc
        except BaseException:  # this caller was cancelled: the others go with the next write
            self._pending[:0] = batch
            raise
        finally:
            self._writing = False
            for flush in batch:
                flush.wake.set()
            if self._pending:
                self._pending[0].wake.set()

    async def _statement(self, batch: list[LogFlush]) -> list[bool | Exception]:
        """`BATCH_FLUSH` of `batch`: each flush's answer (or its failure), in order. The database
        away fails them all; any other failure (one run's values: a record gone after all, which
        the locks should not let happen, or a summary the driver cannot encode) is the failing
        run's alone: each flush is then written on its own."""
        try:
            written: list[bool | Exception] = [*await self._execute(batch)]
            return written
        except StoreUnreachableError:
            raise
        except Exception as exc:
            if len(batch) == 1:
                return [False if isinstance(exc, psycopg.errors.ForeignKeyViolation) else exc]
        answers: list[bool | Exception] = []
        for flush in batch:
            answers += await self._statement([flush])
        return answers

    async def _execute(self, batch: list[LogFlush]) -> list[bool]:
        columns: list[list[Any]] = [[] for _ in range(12)]
        lines: list[str] = []
        owners: list[int] = []
        for i, f in enumerate(batch, 1):
            row = (f.run_id, f.attempt, f.first_seq, len(lines) + 1, f.next_seq, f.log_bytes, f.summary, f.done)
            for column, value in zip(columns, (*row, f.mark, f.announce, f.channel, f.payload), strict=True):
                column.append(value)
            lines += f.lines
            owners += [i] * len(f.lines)
        async with self._db.connection() as conn:
            cur = await conn.execute(BATCH_FLUSH, [*columns, lines, owners])
            rows = await cur.fetchall()
        return [bool(row["live"]) for row in rows]
