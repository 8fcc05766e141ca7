"""Every statement on team-mode kept sessions (`rlm_sessions`, `rlm_session_snapshots`).

Rules kept here, so that no other module needs to know them:

- One clock: ages, idle times and expiry are the database's `now()`.
- One run at a time: a follow-up takes the session with one conditional UPDATE that succeeds
  only while no run holds it (`running_run` is NULL, or its run has ended, or it names a run that
  was never queued for a minute: its front died between the two). Of two follow-ups, on any
  replicas, exactly one gets the row; the other is told which run to wait for.
- The worker that ran a session's run records its end (`finish_run`) before the run's final
  record is written, so a follow-up sent as soon as the result arrives finds the session free.
- Snapshots are bytes to this module (never deserialized on a host), written in 1 MiB chunks in
  one transaction, only for the generation they were taken after, and within the owner's cap.
  A snapshot comes from, and goes to, a file on the worker's host a chunk at a time: no more
  than one chunk of it is in memory. The owner's total is summed and the chunks written under a
  lock of that owner (an advisory lock keyed by the owner): two of an owner's sessions storing
  at once are counted one after the other, so together they stay within the cap. With a bucket
  (RLM_MCP_BLOB_URL) the snapshot is an object instead (`snapshot_objects`), under the same rules.
- Owner-private: every reader gets the owner column and `service.team_sessions` applies the
  owner rule (another owner's session is "unknown").
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.errors import BusyError
from rlm_mcp.ports.session_store import AfterRun, SessionRow
from rlm_mcp.store.pg import snapshot_objects
from rlm_mcp.store.pg.bucket_blobs import BucketBlobs
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.locks import SESSION_LOCK_KEY, SNAPSHOT_OWNER_LOCK_CLASS
from rlm_mcp.store.pg.reads import read_chunks

SNAPSHOT_CHUNK = 1 << 20
ORPHAN_CLAIM_S = 60.0  # a claim whose run was never queued (its front died) lapses after this
FORGET_ENDED_S = 86400.0  # an ended session is remembered this long (a follow-up says why)

# The session's run (if any) has ended, or never reached the queue.
_FREE = (
    "(s.running_run IS NULL OR EXISTS (SELECT 1 FROM rlm_runs r WHERE r.run_id = s.running_run AND r.state = 'done') "
    "OR (NOT EXISTS (SELECT 1 FROM rlm_runs r WHERE r.run_id = s.running_run) "
    f"AND s.running_since < now() - make_interval(secs => {ORPHAN_CLAIM_S})))"
)
_COLUMNS = (
    "s.session_id, s.owner, s.state, extract(epoch FROM s.created_at) AS created_at, "
    "extract(epoch FROM now() - s.created_at) AS age_s, extract(epoch FROM now() - s.last_used_at) AS idle_s, "
    "s.running_run, s.run_ids, s.context_ids, s.histories, s.usage, s.generation, s.worker_id, s.snapshot_gen, "
    f"s.snapshot_bytes, s.snapshot_error, {_FREE} AS free"
)
_EXPIRED = "s.created_at < now() - make_interval(secs => %(max_age)s)"


def _expire(max_age_s: float) -> str:
    """`expire`'s first statement as text without parameters (`Database.opened_transaction`):
    the sessions past `max_age_s` (the setting's seconds, a numeric literal) that no run holds
    end, their ids in one row; ended sessions older than FORGET_ENDED_S go (other rows: a
    session ending now is not among them)."""
    return (
        "WITH forgot AS (DELETE FROM rlm_sessions WHERE state <> 'open' "
        f"AND ended_at < now() - make_interval(secs => {FORGET_ENDED_S!r})), "
        "ended AS (UPDATE rlm_sessions s SET state = 'expired', ended_at = now(), worker_id = NULL, "
        f"snapshot_bytes = NULL, snapshot_gen = NULL WHERE s.state = 'open' AND {_EXPIRED} AND {_FREE} "
        "RETURNING session_id) SELECT coalesce(array_agg(session_id), '{}') AS ended FROM ended"
    ).replace("%(max_age)s", repr(float(max_age_s)))


def _row(row: dict[str, Any]) -> SessionRow:
    return SessionRow(
        session_id=row["session_id"],
        owner=row["owner"],
        state=row["state"],
        created_at=float(row["created_at"]),
        age_s=float(row["age_s"]),
        idle_s=float(row["idle_s"]),
        running_run=row["running_run"],
        free=bool(row["free"]),
        run_ids=[str(r) for r in json.loads(row["run_ids"])],
        context_ids=[str(c) for c in json.loads(row["context_ids"])],
        histories=list(json.loads(row["histories"])),
        usage=dict(json.loads(row["usage"])),
        generation=int(row["generation"]),
        worker_id=None if row["worker_id"] is None else int(row["worker_id"]),
        snapshot_gen=None if row["snapshot_gen"] is None else int(row["snapshot_gen"]),
        snapshot_bytes=None if row["snapshot_bytes"] is None else int(row["snapshot_bytes"]),
        snapshot_error=row["snapshot_error"],
    )


class PgSessionStore:
    """Kept sessions on the team database (`ports.session_store.SessionStorePort`)."""

    def __init__(self, db: Database, bucket: BucketBlobs | None = None) -> None:
        self._db = db
        self._bucket = bucket  # snapshots as objects there; None: as rows

    # --- fronts -----------------------------------------------------------------------------

    async def open(self, session_id: str, owner: str, run_id: str, *, cap: int, max_age_s: float) -> None:
        """A new session, taken by its first run; `BusyError` when `owner` holds `cap` open ones."""
        async with self._db.transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SESSION_LOCK_KEY,))
            cur = await conn.execute(
                "WITH held AS (SELECT count(*) AS n FROM rlm_sessions s WHERE s.owner = %(owner)s AND s.state = 'open' "
                f"  AND NOT {_EXPIRED}) "
                "INSERT INTO rlm_sessions (session_id, owner, running_run, running_since, run_ids) "
                "SELECT %(sid)s, %(owner)s, %(run)s, now(), %(runs)s FROM held WHERE held.n < %(cap)s "
                "RETURNING (SELECT n FROM held) AS held",
                {
                    "owner": owner,
                    "sid": session_id,
                    "run": run_id,
                    "runs": json.dumps([run_id]),
                    "cap": cap,
                    "max_age": max_age_s,
                },
            )
            inserted = await cur.fetchone()
        if inserted is None:
            raise BusyError(
                f"You already hold {cap} kept sessions (RLM_MCP_MAX_SESSIONS_PER_OWNER={cap}).",
                "Close one you no longer need with rlm_close_session (rlm_list_sessions lists them), "
                "or run without keep_session.",
            )

    async def claim(self, session_id: str, owner: str, run_id: str, *, max_age_s: float) -> SessionRow | None:
        """Take `owner`'s open, unexpired session for `run_id` when no run holds it; None
        otherwise (the caller reads the row to say why)."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "UPDATE rlm_sessions s SET running_run = %(run)s, running_since = now(), last_used_at = now(), "
                "run_ids = (s.run_ids::jsonb || to_jsonb(%(run)s::text))::text "
                f"WHERE s.session_id = %(sid)s AND s.owner = %(owner)s AND s.state = 'open' AND NOT {_EXPIRED} AND {_FREE} "
                f"RETURNING {_COLUMNS}",
                {"sid": session_id, "owner": owner, "run": run_id, "max_age": max_age_s},
            )
            row = await cur.fetchone()
        return _row(row) if row is not None else None

    async def unclaim(self, session_id: str, run_id: str) -> None:
        """The run taken for was never queued (refused): the session is free again."""
        async with self._db.connection() as conn:
            await conn.execute(
                "UPDATE rlm_sessions SET running_run = NULL, "
                "run_ids = (SELECT coalesce(jsonb_agg(x), '[]'::jsonb)::text FROM jsonb_array_elements_text(run_ids::jsonb) x "
                "WHERE x <> %(run)s) WHERE session_id = %(sid)s AND running_run = %(run)s",
                {"sid": session_id, "run": run_id},
            )

    async def read(self, session_id: str) -> SessionRow | None:
        async with self._db.connection() as conn:
            cur = await conn.execute(f"SELECT {_COLUMNS} FROM rlm_sessions s WHERE s.session_id = %s", (session_id,))
            row = await cur.fetchone()
        return _row(row) if row is not None else None

    async def list_open(self, owner: str | None, *, max_age_s: float) -> list[SessionRow]:
        """Open, unexpired sessions (of `owner`; all of them for None), oldest first."""
        where = "" if owner is None else " AND s.owner = %(owner)s"
        async with self._db.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM rlm_sessions s WHERE s.state = 'open' AND NOT {_EXPIRED}{where} "
                "ORDER BY s.created_at, s.session_id",
                {"owner": owner, "max_age": max_age_s},
            )
            return [_row(r) for r in await cur.fetchall()]

    async def close(self, session_id: str) -> bool:
        """End an open session no run holds (its snapshot goes); False when it was not."""
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                "UPDATE rlm_sessions s SET state = 'closed', ended_at = now(), worker_id = NULL, snapshot_bytes = NULL, snapshot_gen = NULL "
                f"WHERE s.session_id = %s AND s.state = 'open' AND {_FREE} RETURNING session_id",
                (session_id,),
            )
            closed = await cur.fetchone() is not None
            doomed: list[str] = []
            if closed:
                await conn.execute("DELETE FROM rlm_session_snapshots WHERE session_id = %s", (session_id,))
                doomed = await snapshot_objects.doom(conn, [session_id])
        await self._purge(doomed)
        return closed

    async def _purge(self, doomed: list[str]) -> None:
        if doomed and self._bucket is not None:
            with anyio.CancelScope(shield=True):  # committed: the objects go now, else at the next sweep
                await self._bucket.purge(doomed)

    # --- workers ----------------------------------------------------------------------------

    async def finish_run(self, session_id: str, run_id: str, after: AfterRun) -> int | None:
        """Record the end of the session's run (before the run's own final record): the session
        is free, its state is the REPL's now, and this worker holds its sandbox (None: none). The
        new generation; None when the run no longer held the session."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "UPDATE rlm_sessions SET running_run = NULL, last_used_at = now(), worker_id = %(worker)s, "
                "context_ids = %(contexts)s, histories = %(histories)s, usage = %(usage)s, "
                "generation = generation + CASE WHEN %(began)s THEN 1 ELSE 0 END, "
                "snapshot_error = CASE WHEN %(began)s THEN NULL ELSE snapshot_error END "
                "WHERE session_id = %(sid)s AND running_run = %(run)s RETURNING generation",
                {
                    "sid": session_id,
                    "run": run_id,
                    "worker": after.worker_id,
                    "contexts": json.dumps(after.context_ids),
                    "histories": json.dumps(after.histories),  # ASCII: \u0000 stays escaped
                    "usage": json.dumps(after.usage),
                    "began": after.began,
                },
            )
            row = await cur.fetchone()
        return int(row["generation"]) if row is not None else None

    async def save_snapshot(
        self, session_id: str, generation: int, blob: bytes | Path, *, owner_cap: int
    ) -> str | None:
        """Store the snapshot taken after `generation` (replacing the one before), from memory or
        from a file read a chunk at a time; None when stored, else why not (the session moved on
        or ended, or the owner's cap), recorded."""
        size = len(blob) if isinstance(blob, bytes) else (await anyio.to_thread.run_sync(os.stat, blob)).st_size
        async with self._db.transaction() as conn:
            cur = await conn.execute("SELECT owner FROM rlm_sessions WHERE session_id = %s", (session_id,))
            found = await cur.fetchone()
            if found is None:
                return "the session moved on or ended before its snapshot was stored"
            # The owner's lock first, then the row: every store of this owner counts after the last.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (SNAPSHOT_OWNER_LOCK_CLASS, found["owner"])
            )
            cur = await conn.execute(
                "SELECT owner, generation, state FROM rlm_sessions WHERE session_id = %s FOR UPDATE", (session_id,)
            )
            row = await cur.fetchone()
            if row is None or row["state"] != "open" or int(row["generation"]) != generation:
                return "the session moved on or ended before its snapshot was stored"
            cur = await conn.execute(
                "SELECT coalesce(sum(snapshot_bytes), 0) AS held FROM rlm_sessions WHERE owner = %s AND state = 'open' "
                "AND session_id <> %s",
                (row["owner"], session_id),
            )
            held_row = await cur.fetchone()
            held = int(held_row["held"]) if held_row is not None else 0
            if held + size > owner_cap:
                why = (
                    f"its snapshot ({size} bytes) would take its owner's sessions past "
                    f"RLM_MCP_SESSION_SNAPSHOT_BYTES_PER_OWNER={owner_cap} ({held} bytes held)"
                )
                await conn.execute(
                    "UPDATE rlm_sessions SET snapshot_error = %s WHERE session_id = %s", (why, session_id)
                )
                return why
            await conn.execute("DELETE FROM rlm_session_snapshots WHERE session_id = %s", (session_id,))
            doomed: list[str] = []
            if self._bucket is not None:
                doomed = await snapshot_objects.store(self._bucket, conn, session_id, blob, size)
            else:
                async for idx, chunk in _chunks(blob, size):
                    await conn.execute(
                        "INSERT INTO rlm_session_snapshots VALUES (%s, %s, %b)", (session_id, idx, chunk)
                    )
            await conn.execute(
                "UPDATE rlm_sessions SET snapshot_gen = %s, snapshot_bytes = %s, snapshot_error = NULL "
                "WHERE session_id = %s",
                (generation, size, session_id),
            )
        await self._purge(doomed)
        return None

    async def snapshot_failed(self, session_id: str, generation: int, why: str) -> None:
        """No snapshot could be taken after `generation`: say why (the older one, if any, stays)."""
        async with self._db.connection() as conn:
            await conn.execute(
                "UPDATE rlm_sessions SET snapshot_error = %s WHERE session_id = %s AND generation = %s",
                (why, session_id, generation),
            )

    async def read_snapshot(self, session_id: str) -> tuple[int, bytes] | None:
        """(the generation it was taken after, its bytes); None when the session has none."""
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT snapshot_gen FROM rlm_sessions WHERE session_id = %s", (session_id,))
            row = await cur.fetchone()
            if row is None or row["snapshot_gen"] is None:
                return None
            key = await snapshot_objects.live_key(conn, session_id) if self._bucket is not None else None
            if key is not None and self._bucket is not None:
                return int(row["snapshot_gen"]), await snapshot_objects.read_bytes(self._bucket, key)
            cur = await conn.execute(
                "SELECT data FROM rlm_session_snapshots WHERE session_id = %s ORDER BY idx", (session_id,), binary=True
            )
            parts = [bytes(r["data"]) for r in await cur.fetchall()]
        return int(row["snapshot_gen"]), b"".join(parts)

    async def read_snapshot_into(self, session_id: str, path: Path) -> tuple[int, int] | None:
        """Write the session's snapshot to `path` (a private file, replaced), a chunk at a time:
        (the generation it was taken after, its size); None when the session has none."""
        async with self._db.transaction() as conn:
            # One view of the database throughout: never half of a newer snapshot stored meanwhile.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur = await conn.execute("SELECT snapshot_gen FROM rlm_sessions WHERE session_id = %s", (session_id,))
            row = await cur.fetchone()
            if row is None or row["snapshot_gen"] is None:
                return None
            key = await snapshot_objects.live_key(conn, session_id) if self._bucket is not None else None
            if key is not None and self._bucket is not None:  # else rows stored before the bucket
                return int(row["snapshot_gen"]), await snapshot_objects.read_into(self._bucket, key, path, _private)
            cur = await conn.execute(
                "SELECT count(*) AS n FROM rlm_session_snapshots WHERE session_id = %s", (session_id,)
            )
            counted = await cur.fetchone()
            chunks = int(counted["n"]) if counted is not None else 0
            size = 0
            async with await anyio.open_file(path, "wb", opener=_private) as out:
                async for data in read_chunks(
                    conn,
                    "SELECT data FROM rlm_session_snapshots WHERE session_id = %s AND idx = %s",
                    session_id,
                    chunks,
                ):
                    await out.write(data)
                    size += len(data)
        return int(row["snapshot_gen"]), size

    async def holders(self, session_ids: list[str]) -> dict[str, tuple[str, int | None, int]]:
        """For the sessions a worker holds a sandbox of: (state, holding worker, generation)."""
        if not session_ids:
            return {}
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT session_id, state, worker_id, generation FROM rlm_sessions WHERE session_id = ANY(%s)",
                (session_ids,),
            )
            rows = await cur.fetchall()
        return {r["session_id"]: (r["state"], r["worker_id"], int(r["generation"])) for r in rows}

    async def let_go(self, session_id: str, worker_id: int) -> None:
        """This worker no longer holds the session's sandbox."""
        async with self._db.connection() as conn:
            await conn.execute(
                "UPDATE rlm_sessions SET worker_id = NULL WHERE session_id = %s AND worker_id = %s",
                (session_id, worker_id),
            )

    # --- sweeps -----------------------------------------------------------------------------

    async def expire(self, *, max_age_s: float) -> int:
        """End sessions past their maximum age that no run holds (their snapshots go), and forget
        ended sessions after a day; how many ended now."""
        # With its BEGIN in one round trip, and the COMMIT: two round trips when nothing ends.
        async with self._db.opened_transaction(_expire(max_age_s)) as (conn, row):
            ended: list[str] = list(row["ended"]) if row is not None else []
            doomed: list[str] = []
            if ended:
                await conn.execute("DELETE FROM rlm_session_snapshots WHERE session_id = ANY(%s)", (ended,))
                doomed = await snapshot_objects.doom(conn, ended)
        await self._purge(doomed)
        return len(ended)


def _private(path: str, flags: int) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


async def _chunks(blob: bytes | Path, size: int) -> AsyncIterator[tuple[int, bytes]]:
    """(index, bytes) of each SNAPSHOT_CHUNK of `blob`; one chunk in memory at a time from a file."""
    if isinstance(blob, bytes):
        view = memoryview(blob)
        for idx, start in enumerate(range(0, max(size, 1), SNAPSHOT_CHUNK)):
            yield idx, bytes(view[start : start + SNAPSHOT_CHUNK])
        return
    async with await anyio.open_file(blob, "rb") as source:
        idx = 0
        while True:
            chunk = await source.read(SNAPSHOT_CHUNK)
            if not chunk and idx:
                return
            yield idx, chunk
            idx += 1
            if len(chunk) < SNAPSHOT_CHUNK:
                return
