"""What the tests over both stores (`store_settings`) do beneath the store ports: simulate age,
a dead process's pin or a foreign log line, and read what a store holds, in SQLite and files or
in PostgreSQL. The service never reaches past the ports; only these tests do.

Each helper takes the opened `Stores` (`stores.kind` says which) and, for the file store's run
records, the settings (the data dir).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.runs import RunStore
from rlm_mcp.store.sqlite_index import ContextStore


def _sqlite(stores: Stores) -> ContextStore:
    assert isinstance(stores.contexts, ContextStore)
    return stores.contexts


def _db(stores: Stores) -> Any:
    from rlm_mcp.store.pg import Database

    assert isinstance(stores.lifecycle, Database)
    return stores.lifecycle


def _runs_dir(settings: Settings) -> Path:
    return Path(settings.store.data_dir) / "runs"


# --- contexts --------------------------------------------------------------------------------


async def stored_bytes(stores: Stores, sha256: str) -> bytes:
    """The bytes the store itself holds for a blob (SQLite: its file; PostgreSQL: its chunks;
    with a bucket: the object the index names)."""
    if stores.kind == "sqlite":
        return _sqlite(stores).blob_path(sha256).read_bytes()
    from rlm_mcp.store.pg.bucket_blobs import BucketBlobs

    port = getattr(getattr(stores.contexts, "rows", None), "blobs", None)
    if isinstance(port, BucketBlobs):
        async with _db(stores).connection() as conn:
            cur = await conn.execute(
                "SELECT key FROM rlm_objects WHERE sha256 = %s AND state = 'live' ORDER BY key LIMIT 1", (sha256,)
            )
            row = await cur.fetchone()
        if row is None:
            return b""
        return b"".join([piece async for piece in port.bucket.read(row["key"])])
    async with _db(stores).connection() as conn:
        cur = await conn.execute(
            # copy 0, the one replicas read (each owner holding the bytes has a copy: store/pg/blobs.py)
            "SELECT data FROM rlm_blob_chunks WHERE sha256 = %s AND idx < %s ORDER BY idx",
            (sha256, 1 << 20),
            binary=True,
        )
        return b"".join(bytes(r["data"]) for r in await cur.fetchall())


async def age_context(stores: Stores, context_id: str, seconds: float) -> None:
    """Make a context last used `seconds` ago (what eviction ranks by)."""
    when = time.time() - seconds
    if stores.kind == "sqlite":
        with sqlite3.connect(_sqlite(stores).db_path) as conn:
            conn.execute("UPDATE contexts SET last_used_at = ? WHERE context_id = ?", (when, context_id))
        return
    async with _db(stores).connection() as conn:
        await conn.execute("UPDATE rlm_contexts SET last_used_at = %s WHERE context_id = %s", (when, context_id))


async def drop_ownership(stores: Stores, owner: str) -> None:
    """Remove every ownership row of `owner` beneath the store (nothing else goes with them)."""
    if stores.kind == "sqlite":
        with sqlite3.connect(_sqlite(stores).db_path) as conn:
            conn.execute("DELETE FROM context_owners WHERE owner = ?", (owner,))
        return
    async with _db(stores).connection() as conn:
        await conn.execute("DELETE FROM rlm_context_owners WHERE owner = %s", (owner,))


async def pin_count(stores: Stores) -> int:
    if stores.kind == "sqlite":
        with sqlite3.connect(_sqlite(stores).db_path) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM pins").fetchone()[0])
    async with _db(stores).connection() as conn:
        cur = await conn.execute("SELECT COUNT(*) AS n FROM rlm_pins")
        row = await cur.fetchone()
    return int(row["n"])


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def add_lapsed_pins(stores: Stores, context_id: str) -> None:
    """Two pins on `context_id` that no longer protect it. SQLite: one of a dead process on this
    host, one of another host past its expiry. PostgreSQL: one of a replica that stopped beating,
    one of this replica past its expiry."""
    owner = "local"
    if stores.kind == "sqlite":
        from rlm_mcp.store import _db as sqlite_db

        row = "INSERT INTO pins (pin_id, context_id, host, pid, proc_start, expires_at) "
        with sqlite3.connect(_sqlite(stores).db_path) as conn:
            conn.execute(
                row + "VALUES ('p', ?, ?, ?, NULL, ?)", (context_id, sqlite_db.HOST, _dead_pid(), time.time() + 999)
            )
            conn.execute(row + "VALUES ('q', ?, 'other-host', 1, NULL, ?)", (context_id, time.time() - 1))
        return
    db = _db(stores)
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO rlm_pins VALUES ('p', %s, 'a-replica-gone-silent', %s, %s)",
            (context_id, owner, time.time() + 999),
        )
        await conn.execute(
            "INSERT INTO rlm_pins VALUES ('q', %s, %s, %s, %s)", (context_id, db.replica_id, owner, time.time() - 1)
        )


# --- uploads ---------------------------------------------------------------------------------


async def pending_upload_bytes(stores: Stores, settings: Settings) -> int:
    """What unfinished uploads occupy (SQLite: files under data_dir/uploads; PostgreSQL: chunk rows)."""
    if stores.kind == "sqlite":
        return sum(p.stat().st_size for p in (Path(settings.store.data_dir) / "uploads").rglob("*") if p.is_file())
    async with _db(stores).connection() as conn:
        cur = await conn.execute("SELECT COALESCE(SUM(octet_length(data)), 0) AS n FROM rlm_upload_chunks")
        row = await cur.fetchone()
    return int(row["n"])


async def age_uploads(stores: Stores, seconds: float) -> None:
    """Make every upload's last chunk `seconds` old (what expiry goes by)."""
    when = time.time() - seconds
    if stores.kind == "sqlite":
        with sqlite3.connect(_sqlite(stores).db_path) as conn:
            conn.execute("UPDATE uploads SET updated_at = ?", (when,))
        return
    async with _db(stores).connection() as conn:
        await conn.execute("UPDATE rlm_uploads SET updated_at = %s", (when,))


async def upload_chunks_kept(stores: Stores, settings: Settings, upload_id: str) -> bool:
    """Whether anything of an upload's chunks is still stored."""
    if stores.kind == "sqlite":
        return (Path(settings.store.data_dir) / "uploads" / upload_id).exists()
    async with _db(stores).connection() as conn:
        cur = await conn.execute("SELECT 1 FROM rlm_upload_chunks WHERE upload_id = %s LIMIT 1", (upload_id,))
        return await cur.fetchone() is not None


# --- run records -----------------------------------------------------------------------------


def bounded_runs(stores: Stores, settings: Settings, *, max_event_bytes: int, max_log_bytes: int) -> Any:
    """The run store of `stores`' kind with smaller caps on one event and the whole log."""
    if stores.kind == "sqlite":
        return RunStore(settings.store, max_event_bytes=max_event_bytes, max_log_bytes=max_log_bytes)
    from rlm_mcp.store.pg.runs import PgRunStore

    return PgRunStore(_db(stores), max_event_bytes=max_event_bytes, max_log_bytes=max_log_bytes)


async def event_lines(stores: Stores, settings: Settings, run_id: str) -> list[bytes]:
    """A run's log as stored: one JSON line per event, newline included."""
    if stores.kind == "sqlite":
        return (_runs_dir(settings) / run_id / "events.jsonl").read_bytes().splitlines(keepends=True)
    async with _db(stores).connection() as conn:
        cur = await conn.execute("SELECT line FROM rlm_run_events WHERE run_id = %s ORDER BY seq", (run_id,))
        return [(r["line"] + "\n").encode() for r in await cur.fetchall()]


async def add_event_lines(stores: Stores, settings: Settings, run_id: str, lines: list[bytes]) -> None:
    """Append lines to a run's log as another version (or a hand) would have written them."""
    if stores.kind == "sqlite":
        path = anyio.Path(_runs_dir(settings) / run_id / "events.jsonl")
        await path.write_bytes(await path.read_bytes() + b"".join(line + b"\n" for line in lines))
        return
    async with _db(stores).connection() as conn:
        cur = await conn.execute(
            "SELECT COALESCE(MAX(seq) + 1, 0) AS n FROM rlm_run_events WHERE run_id = %s", (run_id,)
        )
        row = await cur.fetchone()
        for seq, line in enumerate(lines, start=int(row["n"])):
            await conn.execute("INSERT INTO rlm_run_events VALUES (%s, %s, %s)", (run_id, seq, line.decode()))


async def touch_run(stores: Stores, settings: Settings, run_id: str, when: float) -> None:
    """Make a run's record last written at `when` (what pruning ranks and ages by)."""
    if stores.kind == "sqlite":
        os.utime(_runs_dir(settings) / run_id / "summary.json", (when, when))
        return
    async with _db(stores).connection() as conn:
        await conn.execute("UPDATE rlm_runs SET updated_at = %s WHERE run_id = %s", (when, run_id))
