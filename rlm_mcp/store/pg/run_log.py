"""A run's log in PostgreSQL (team mode), as its worker writes it: events staged and written by
each flush (with the live summary and its wake-up when one is published), a worker's flushes
through its process's writer (`store.pg.log_writer`: the flushes of its runs pending at once in
one fenced statement), and the final record with the last events in the queue's one conditional
end write.

Every write is fenced by the claim's attempt: a former attempt's flush lands nothing. Each event
is the one JSON line the file store would write (`store.event_lines`), so this log knows no
event type. `store.pg.runs.PgRunStore` opens these logs and reads them back.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import anyio
import psycopg

from rlm_mcp.call_lines import CallLine
from rlm_mcp.events import LogTruncated, RunEvent, to_json
from rlm_mcp.ports.queue import RunPins
from rlm_mcp.ports.runs import LIVE_MAX_BYTES, RunRecord, encode_final, encode_live
from rlm_mcp.store.event_lines import call_event_line, encode_event, event_line
from rlm_mcp.store.pg import queue_statements as queue_sql
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.log_writer import LogFlush, PgLogWriter

log = logging.getLogger("rlm_mcp.store")


def dump_record(record: RunRecord) -> str:
    """The record as its `rlm_runs.summary` JSON."""
    return json.dumps(record.to_stored(), ensure_ascii=False)


def _same_head(a: RunRecord, b: RunRecord) -> bool:
    """Whether the two records' `stored_head` is the same (the request is immutable: the same
    object, the same keys)."""
    return a.request is b.request and a.run_id == b.run_id and a.created_at == b.created_at


class PgRunLog:
    """The open log of one run. Events are staged in order, each with the next sequence, and
    written by `flush`: all staged rows in one multi-row INSERT, in the same statement as the
    record's counters (and, for a team worker, the live summary, the `lm_called` mark and the
    NOTIFY, in its process writer's statement). `append` stages and flushes at once (write-through); a team worker stages with
    `stage` and flushes at the moments that matter (service/queue/runlog.py)."""

    def __init__(
        self,
        db: Database,
        run_id: str,
        *,
        created_at: float,
        max_event_bytes: int,
        max_log_bytes: int,
        attempt: int | None = None,
        writer: PgLogWriter | None = None,
    ) -> None:
        """`attempt`: the claim a team worker executes the run under; every flush then writes
        only while the run is still `running` under that attempt (fencing: a worker declared lost
        and resumed writes nothing over the run's next attempt). `writer`: the process's writer
        of its runs' flushes: with an attempt every flush goes through a writer (this one, else
        one of the log's own), where the flushes of all the runs pending at once go in one
        statement and the fence is applied (`store.pg.log_writer`)."""
        self._db = db
        self._writer = (writer or PgLogWriter(db)) if attempt is not None else None
        self._run_id = run_id
        self._channel = queue_sql.run_channel(run_id)  # a digest: taken once, not at every publish
        self._attempt = attempt
        self._created_at = created_at
        self._seq = 0
        self._written = 0
        self._max_event = max_event_bytes
        self._max_log = max_log_bytes
        self._truncated = False
        self._closed = False
        self._detached = False
        self._staged: list[tuple[int, str]] = []  # (seq, line without its newline), in seq order
        # The stored record's head (`RunRecord.stored_head`) as JSON without its closing brace,
        # and the record it was encoded from (its request and creation never change).
        self._head: tuple[RunRecord, str] | None = None
        # One flush at a time: rows leave the stage only once written. Uncontended (the usual
        # case: one reporter per run), taken without a checkpoint's extra pass of the loop.
        self._lock = anyio.Lock(fast_acquire=True)

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def attempt(self) -> int | None:
        return self._attempt

    @property
    def detached(self) -> bool:
        return self._detached

    @property
    def staged(self) -> int:
        """Events staged and not written yet."""
        return len(self._staged)

    def detach(self) -> None:
        """Stage nothing more and write no summary (a team worker hands a run back to the queue);
        what was staged before is still written by the next flush."""
        self._closed = True
        self._detached = True

    def resume(self, seq: int, written: int) -> None:
        """Continue a log that already holds `seq` events of `written` bytes."""
        self._seq = seq
        self._written = written

    async def open(self) -> None:
        """Nothing to open: each flush borrows a pooled connection (the record already exists,
        so rlm_status answers while the run is queued)."""

    async def append(self, event: RunEvent) -> None:
        self.stage(event)
        await self.flush()

    async def append_line(self, line: bytes) -> None:
        """Append one already-encoded JSON line (newline included), written at once."""
        self.stage_line(line)
        await self.flush()

    async def append_call(self, call: CallLine) -> None:
        """`append(call.event())`: the same line, encoded without building the event's model."""
        self.stage_call(call)
        await self.flush()

    def stage(self, event: RunEvent) -> None:
        self.stage_line(event_line(event, self._max_event))

    def stage_call(self, call: CallLine) -> None:
        """`stage(call.event())`: the same line, encoded without building the event's model."""
        self.stage_line(call_event_line(call, self._max_event))

    def stage_line(self, line: bytes) -> None:
        """Give the line the next sequence (or the truncation marker, once the log is full)."""
        if self._closed or self._truncated:
            return
        if self._written + len(line) > self._max_log:
            self._truncated = True
            line = encode_event(to_json(LogTruncated(ts=time.time(), max_bytes=self._max_log)), 1024)
        self._staged.append((self._seq, line.decode().rstrip("\n")))
        self._seq += 1
        self._written += len(line)

    async def flush(
        self, *, summary: RunRecord | None = None, mark_lm_called: bool = False, announce: bool = False
    ) -> bool:
        """Write the staged events, with the record `summary` (never over a final one), the
        `lm_called` mark and (`announce`) a NOTIFY on the run's channel, in one statement. The NOTIFY's
        payload is the record's live summary (`ports.runs.encode_live`: bounded) while the run
        is live, else the run id alone. False when the run has ended (a summary written over an
        ended run is dropped, the events and counters are written), its record is gone, or (with
        an attempt) it is no longer this attempt's: then nothing is written. A failed flush keeps its rows staged
        for the next one; a retried flush whose first try did commit writes no row twice
        (`ON CONFLICT DO NOTHING` on the (run, seq) key, counters set, not added)."""
        async with self._lock:
            rows = list(self._staged)
            if self._detached:
                summary = None
            if not rows and summary is None and not mark_lm_called and not announce:
                return True
            if self._writer is not None:  # a worker's log (an attempt): fenced, with its process's other runs
                live = await self._writer.write(self._batched(rows, summary, mark_lm_called, announce))
                del self._staged[: len(rows)]
                return live
            params: list[Any] = []
            ctes = self._events_cte(rows, params)
            # The database's clock: record ages are compared across replicas (pruning).
            sets = [
                "updated_at = extract(epoch FROM clock_timestamp())",
                "next_seq = GREATEST(next_seq, %s)",
                "log_bytes = GREATEST(log_bytes, %s)",
            ]
            params += [self._seq, self._written]
            payload = self._run_id
            if summary is not None:
                # Never over a final summary (`queue_statements.SET_SUMMARY`, the one writer of state).
                sets += list(queue_sql.SET_SUMMARY)
                stored, tail = self._dump_parts(summary)
                params += [stored, summary.done]
                if announce and not summary.done:
                    payload = self._live_payload(summary, tail)
            if mark_lm_called:
                sets.append("lm_called = true")
            params.append(self._run_id)
            ctes.append(f"up AS (UPDATE rlm_runs SET {', '.join(sets)} WHERE run_id = %s RETURNING done)")
            select = "SELECT live"
            if announce:
                # The summary rides along only while the run is live (a run that ended
                # elsewhere is announced by its id alone: its follower reads the final row).
                select += ", pg_notify(%s, CASE WHEN live THEN %s ELSE %s END)"
                params += [self._channel, payload, self._run_id]
            select += " FROM (SELECT coalesce((SELECT NOT done FROM up), false) AS live) AS s"
            try:
                async with self._db.connection() as conn:
                    cur = await conn.execute(f"WITH {', '.join(ctes)} {select}", params)
                    row = await cur.fetchone()
            except psycopg.errors.ForeignKeyViolation:  # the record was pruned: nothing to add to
                row = None
            del self._staged[: len(rows)]
        return bool(row and row["live"])

    def _batched(
        self, rows: list[tuple[int, str]], summary: RunRecord | None, mark_lm_called: bool, announce: bool
    ) -> LogFlush:
        """This flush as the writer takes it (the same values as the statement `flush` writes alone)."""
        assert self._attempt is not None
        stored, payload = None, self._run_id
        if summary is not None:
            stored, tail = self._dump_parts(summary)
            if announce and not summary.done:  # the NOTIFY's alone: not encoded when none is sent
                payload = self._live_payload(summary, tail)
        return LogFlush(
            run_id=self._run_id,
            attempt=self._attempt,
            first_seq=rows[0][0] if rows else self._seq,
            lines=[line for _, line in rows],
            next_seq=self._seq,
            log_bytes=self._written,
            summary=stored,
            done=summary is not None and summary.done,
            mark=mark_lm_called,
            announce=announce,
            channel=self._channel,
            payload=payload,
        )

    def _events_cte(self, rows: list[tuple[int, str]], params: list[Any]) -> list[str]:
        """The staged rows' INSERT as a CTE (none when nothing is staged), its parameters added
        to `params`; fenced by the attempt, if any: nothing lands once the run is not its."""
        if not rows:
            return []
        # One binary array (`%b`) of lines, sequences consecutive from the first (staged in order, written
        # from the front): one statement text for any number of rows, converted once by the driver.
        params += [self._run_id, self._attempt or 0, rows[0][0], [line for _, line in rows]]
        fence = ""
        if self._attempt is not None:
            fence = queue_sql.EVENTS_FENCE
            params += [self._run_id, self._attempt]
        return [
            "ev AS (INSERT INTO rlm_run_events (run_id, attempt, seq, line) SELECT %s, %s::integer, %s::bigint + v.n - 1, "
            f"v.line FROM unnest(%b::text[]) WITH ORDINALITY AS v (line, n){fence} ON CONFLICT DO NOTHING)"
        ]

    async def finish(self, summary: RunRecord, *, pins: RunPins | None = None) -> bool:
        """The staged events and the final record `summary` in one statement: the queue's fenced
        end write (`queue_statements.FINISH_LOGGED`, the same as `PgRunQueue.finish` with this
        log's attempt) and the wake-up, which carries the final record when it fits (its followers
        read no row); True if this call ended the run. Only for a worker's log
        (an attempt) that is not detached. A failed call keeps the rows staged (the caller
        retries with `flush` and the queue's `finish`, `service/queue/final_writes.py`). `pins`:
        the run's context pins (`store.pg.contexts`), removed by the same statement, fence or not
        (`queue_statements.UNPIN`), and marked released once it ran: the run's end lets them go
        with no statement of its own (a failed call leaves them to their holder's exit)."""
        if self._attempt is None or self._detached or not summary.done:
            raise RuntimeError("finish: only a worker's attached log ends its run, with a final record")
        async with self._lock:
            rows = list(self._staged)
            params: list[Any] = []
            ctes = self._events_cte(rows, params)
            unpin = pins.to_release if pins is not None else None
            if unpin is not None:
                ctes.append(queue_sql.UNPIN)
                params.append(unpin)
            stored = dump_record(summary)
            params += [stored, self._seq, self._written, self._run_id, self._attempt]
            params += [self._channel, encode_final(self._run_id, stored), self._run_id]
            ctes.append(queue_sql.FINISH_LOGGED)
            try:
                async with self._db.connection() as conn:
                    cur = await conn.execute("WITH " + ", ".join(ctes), params)
                    row = await cur.fetchone()
            except psycopg.errors.ForeignKeyViolation:  # the record was pruned: nothing to end
                row = None  # nor were the pins removed: their holder's exit does it
            else:
                if pins is not None and unpin is not None:
                    pins.mark_removed()
            del self._staged[: len(rows)]
        return bool(row and row["ended"])

    def _dump_parts(self, record: RunRecord) -> tuple[str, str]:
        """`dump_record(record)`, its head encoded once per run: the same text, spliced (a worker
        publishes a live summary at every progress event; its request is most of the JSON);
        and the tail's JSON (`RunRecord.stored_tail`), which `_live_payload` reuses."""
        head = self._head
        if head is None or not _same_head(head[0], record):
            head = self._head = (record, json.dumps(record.stored_head(), ensure_ascii=False)[:-1])
        tail = json.dumps(record.stored_tail(), ensure_ascii=False)
        return head[1] + ", " + tail[1:], tail

    def _live_payload(self, record: RunRecord, tail: str) -> str:
        """`encode_live(run_id, record)` of a live record. Without a result or a start failure,
        the record's tail is its live summary's JSON, key for key (`state_json` and this writer's
        version), so its text is sent as it is, not encoded a second time; `encode_live` decides
        what is too long (it leaves the per-model usage out, or sends the run id alone)."""
        if record.result is None and record.not_started is None:
            payload = f"{self._run_id} {tail}"
            if len(payload.encode()) <= LIVE_MAX_BYTES:
                return payload
        return encode_live(self._run_id, record)

    def _dump(self, record: RunRecord) -> str:
        return self._dump_parts(record)[0]

    async def write_summary(self, summary: RunRecord) -> None:
        """The staged events and the record, in one statement (none once detached)."""
        await self.flush(summary=summary)

    async def aclose(self) -> None:
        """Stage nothing more; write what is staged."""
        self._closed = True
        await self.flush()
