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
import time
from typing import Any

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, UnknownIdError
from rlm_mcp.events import LoggedEvent, LogTruncated, RunEvent, loads, to_json
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER, OwnerScope, sees
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.runs import MAX_EVENT_BYTES, MAX_LOG_BYTES, check_run_id, encode_event

log = logging.getLogger("rlm_mcp.store")


def _unknown(run_id: str) -> UnknownIdError:
    return UnknownIdError("run", run_id)


def _dump(summary: dict[str, Any]) -> str:
    return json.dumps(summary, ensure_ascii=False, default=str)


class PgRunLog:
    """The open log of one run; appends are serialised, each one a row with the next sequence."""

    def __init__(
        self, db: Database, run_id: str, *, created_at: float, max_event_bytes: int, max_log_bytes: int
    ) -> None:
        self._db = db
        self._run_id = run_id
        self._created_at = created_at
        self._seq = 0
        self._written = 0
        self._max_event = max_event_bytes
        self._max_log = max_log_bytes
        self._truncated = False
        self._closed = False
        self._detached = False
        self._lock = anyio.Lock()

    @property
    def run_id(self) -> str:
        return self._run_id

    def detach(self) -> None:
        """Write nothing more, summary included (a team worker hands a run back to the queue)."""
        self._closed = True
        self._detached = True

    def resume(self, seq: int, written: int) -> None:
        """Continue a log that already holds `seq` events of `written` bytes."""
        self._seq = seq
        self._written = written

    async def open(self) -> None:
        """Nothing to open: each append borrows a pooled connection (the record already exists,
        so rlm_status answers while the run is queued)."""

    async def append(self, event: RunEvent) -> None:
        await self.append_line(encode_event(to_json(event, ts=time.time()), self._max_event))

    async def append_line(self, line: bytes) -> None:
        """Append one already-encoded JSON line (newline included)."""
        async with self._lock:
            if self._closed or self._truncated:
                return
            if self._written + len(line) > self._max_log:
                self._truncated = True
                line = encode_event(to_json(LogTruncated(ts=time.time(), max_bytes=self._max_log)), 1024)
            async with self._db.connection() as conn:
                await conn.execute(
                    "WITH ev AS (INSERT INTO rlm_run_events VALUES (%s, %s, %s)) "
                    "UPDATE rlm_runs SET log_bytes = log_bytes + %s, next_seq = %s, updated_at = %s WHERE run_id = %s",
                    (
                        self._run_id,
                        self._seq,
                        line.decode().rstrip("\n"),
                        len(line),
                        self._seq + 1,
                        time.time(),
                        self._run_id,
                    ),
                )
            self._seq += 1
            self._written += len(line)

    async def write_summary(self, summary: dict[str, Any]) -> None:
        if self._detached:
            return
        full = {"run_id": self._run_id, "created_at": self._created_at, **summary}
        async with self._db.connection() as conn:
            await conn.execute(
                # Never over a final summary: in team mode another process may have ended the
                # run first (a cancel while queued, a sweeper that found its worker lost).
                "UPDATE rlm_runs SET summary = %s, done = %s, updated_at = %s WHERE run_id = %s AND NOT done",
                (_dump(full), "result" in full, time.time(), self._run_id),
            )

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True


class PgRunStore:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_log_bytes: int = MAX_LOG_BYTES,
    ) -> None:
        self._db = db
        self._max_event = max_event_bytes
        self._max_log = max_log_bytes

    async def create(self, run_id: str, summary: dict[str, Any]) -> PgRunLog:
        check_run_id(run_id)
        created_at = time.time()
        full = {"run_id": run_id, "created_at": created_at, **summary}
        owner = full.get("owner", LOCAL_OWNER)
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO rlm_runs (run_id, owner, created_at, updated_at, done, summary) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
                (run_id, str(owner), created_at, created_at, "result" in full, _dump(full)),
            )
            if await cur.fetchone() is None:
                raise BadArgumentError(f"Run id '{run_id}' already exists.", "Use a new, unique run id.")
        return PgRunLog(
            self._db, run_id, created_at=created_at, max_event_bytes=self._max_event, max_log_bytes=self._max_log
        )

    async def reopen(self, run_id: str) -> PgRunLog:
        """The log of a run created elsewhere (a team-mode worker executes a queued run):
        appends go on after the events already there."""
        check_run_id(run_id)
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT created_at, next_seq, log_bytes FROM rlm_runs WHERE run_id = %s", (run_id,)
            )
            row = await cur.fetchone()
        if row is None:
            raise _unknown(run_id)
        log = PgRunLog(
            self._db, run_id, created_at=row["created_at"], max_event_bytes=self._max_event, max_log_bytes=self._max_log
        )
        log.resume(int(row["next_seq"]), int(row["log_bytes"]))
        return log

    async def read_summary(self, run_id: str, *, owner: OwnerScope) -> dict[str, Any]:
        check_run_id(run_id)
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT owner, summary FROM rlm_runs WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
        if row is None or not sees(owner, row["owner"]):
            raise _unknown(run_id)
        summary: dict[str, Any] = json.loads(row["summary"])
        return summary

    async def read_events(
        self, run_id: str, *, owner: OwnerScope, limit_bytes: int | None = None
    ) -> builtins.list[LoggedEvent]:
        await self.read_summary(run_id, owner=owner)
        events: list[LoggedEvent] = []
        used = 0
        async with self._db.connection() as conn:
            cur = conn.cursor()
            async for row in cur.stream(
                "SELECT seq, line FROM rlm_run_events WHERE run_id = %s ORDER BY seq", (run_id,)
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

    async def version(self, run_id: str) -> str:
        check_run_id(run_id)
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT log_bytes, updated_at FROM rlm_runs WHERE run_id = %s", (run_id,))
            row = await cur.fetchone()
        if row is None:
            raise _unknown(run_id)
        return f"{row['log_bytes']}-{row['updated_at']!r}"

    async def prune(self, *, max_records: int, max_age_days: float) -> builtins.list[str]:
        now = time.time()
        removed: list[str] = []
        async with self._db.transaction() as conn:
            if max_age_days > 0:
                cur = await conn.execute(
                    "DELETE FROM rlm_runs WHERE updated_at < %s RETURNING run_id", (now - max_age_days * 86400,)
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

    async def list(self, limit: int = 50, *, owner: OwnerScope) -> builtins.list[dict[str, Any]]:
        async with self._db.connection() as conn:
            if owner is EVERY_OWNER:
                cur = await conn.execute(
                    "SELECT summary FROM rlm_runs ORDER BY created_at DESC LIMIT %s", (max(0, limit),)
                )
            else:
                cur = await conn.execute(
                    "SELECT summary FROM rlm_runs WHERE owner = %s ORDER BY created_at DESC LIMIT %s",
                    (owner, max(0, limit)),
                )
            rows = await cur.fetchall()
        return [json.loads(r["summary"]) for r in rows]
