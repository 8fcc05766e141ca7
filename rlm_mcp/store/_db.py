"""The metadata index: one SQLite file shared by every server process using a data dir.

Each operation borrows a connection inside a worker thread (a few idle ones are kept per file,
see `_borrow`), which keeps connections off the event loop, except a read that cannot wait
(`read_here`: a context's row at a run's admission); this process's writers queue on a
mutex, other processes' on SQLite's busy handler. WAL mode lets readers run while one process writes; the busy timeout makes a
second writer wait instead of failing with "database is locked". Every write runs inside
`BEGIN IMMEDIATE`, so the write lock is taken up front and a read-then-write sequence cannot
be interleaved with another process's write.
"""

from __future__ import annotations

import os
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import anyio

from rlm_mcp.lru import LruMap
from rlm_mcp.store.migrations import Migration, pending

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000


# The schema is migrated (or found current) once per process per file, not at every operation.
# Keyed by path, with the inode it was done for: a data dir deleted and made again at the same
# path gets its schema (and fresh connections) again.
_initialised: dict[str, int] = {}
_init_lock = threading.Lock()

# One idle connection kept open per recently used file: closing the last connection to a WAL
# database checkpoints it and deletes the WAL (with fsyncs): ~10 ms per operation here, twice
# per run. A kept connection holds no lock while idle. Bounded, so that a process touching
# many data dirs (the tests) does not hold their files open forever: the least recently used
# file's connections are closed (`_drop`).
KEEP_OPEN = 4


# Connections are reused: opening one (two PRAGMAs) and closing it cost ~1.5 ms of a 2.3 ms pin,
# and under load each of those steps waits for the GIL. Idle ones are kept per file (a few per
# file, for the files in `_keepers`, each idle at most IDLE_S so a burst's extra connections and
# their fds go again), tagged with the inode they were opened on (a data dir deleted and made again
# at the same path gets fresh ones) and never lent inside a transaction.
IDLE_PER_FILE = 4
IDLE_S = 10.0
_idle: dict[str, list[tuple[sqlite3.Connection, int, float]]] = {}


def _drop(key: str, kept: sqlite3.Connection | None) -> None:
    """Close a file's kept connection and its idle ones (call with `_init_lock` held)."""
    if kept is not None:
        kept.close()
    for conn, _, _ in _idle.pop(key, []):
        conn.close()


_keepers: LruMap[str, sqlite3.Connection] = LruMap(KEEP_OPEN, on_evict=_drop)


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1


def _expired(pool: list[tuple[sqlite3.Connection, int, float]], now: float) -> list[sqlite3.Connection]:
    """Drop (and return, to be closed outside the lock) the connections idle too long."""
    old = [conn for conn, _, since in pool if now - since > IDLE_S]
    if old:
        pool[:] = [entry for entry in pool if now - entry[2] <= IDLE_S]
    return old


def _borrow(path: Path, inode: int) -> sqlite3.Connection:
    key = str(path)
    now = time.monotonic()
    found: sqlite3.Connection | None = None
    with _init_lock:
        pool = _idle.get(key, [])
        stale = _expired(pool, now)
        while pool:
            conn, conn_inode, _ = pool.pop()
            if conn_inode == inode:
                found = conn
                break
            stale.append(conn)
    for conn in stale:
        conn.close()
    return found if found is not None else _open(path)


def _borrow_idle(path: Path, inode: int) -> sqlite3.Connection | None:
    """An idle connection to `path` opened on `inode`, or None (opening one may wait on a lock)."""
    with _init_lock:
        pool = _idle.get(str(path), [])
        for index in range(len(pool) - 1, -1, -1):
            conn, conn_inode, _ = pool[index]
            if conn_inode == inode:
                del pool[index]
                return conn
    return None


def _give_back(path: Path, conn: sqlite3.Connection, inode: int) -> None:
    key = str(path)
    stale: list[sqlite3.Connection] = [conn]
    if not conn.in_transaction:
        with _init_lock:
            if key in _keepers:  # a file still in use: keep it (bounded by KEEP_OPEN files)
                pool = _idle.setdefault(key, [])
                now = time.monotonic()
                stale = _expired(pool, now)
                if len(pool) < IDLE_PER_FILE:
                    pool.append((conn, inode, now))
                else:
                    stale.append(conn)
    for old in stale:
        old.close()


def _open(path: Path) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN ourselves, so transactions are explicit;
    # check_same_thread=False: a pooled connection serves one worker thread at a time.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # In WAL mode NORMAL skips the fsync on every commit (checkpoints still sync) and the file
    # cannot be corrupted; a power cut may lose the last commits, i.e. pins and last-used times
    # (dead pins are ignored anyway) or a just-stored context's row. FULL cost a run two fsyncs
    # (pin, unpin) on its critical path: 15-20 ms each on a busy disk.
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _ensure_schema(path: Path) -> int:
    """Create the schema once per file; returns the file's inode (connections are tagged with it)."""
    key = str(path)
    inode = _inode(path)
    with _init_lock:
        if _initialised.get(key) == inode != -1:
            _keep_open(key, path)
            return inode
        _forget(key)  # a new file at this path (or the first use): nothing kept may serve it
        # 0700: the data dir holds users' documents (see ContextStore._prepare).
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        # Two servers opening a fresh file at once can both hold a shared lock while asking
        # for the exclusive one the WAL switch needs; SQLite then answers "locked" at once
        # (no busy wait, it would deadlock), so the loser backs off and tries again.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                _create_schema(path)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02 + random.random() * 0.08)
        inode = _inode(path)
        _initialised[key] = inode
        _keep_open(key, path)
        return inode


def _keep_open(key: str, path: Path) -> None:
    """Keep an idle connection to `path` (call with `_init_lock` held)."""
    if _keepers.use(key) is None:
        _keepers.put(key, sqlite3.connect(path, check_same_thread=False))  # never used, only held


def _forget(key: str) -> None:
    """Close the kept and idle connections of one file (call with `_init_lock` held)."""
    _drop(key, _keepers.pop(key))


def _create_schema(path: Path) -> None:
    conn = _open(path)
    try:
        # journal_mode is persistent in the file; setting it again is a no-op.
        conn.execute("PRAGMA journal_mode = WAL")
        _migrate(conn, path)
    finally:
        conn.close()


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the index's pending migrations (`store/migrations/sqlite/`), each in a transaction
    under `BEGIN IMMEDIATE` that reads the version again (`PRAGMA user_version`: 0 in a new file
    and in those of releases before it was kept), so processes starting together take turns and
    the later ones find nothing left to do. A current file costs one read and no write lock."""
    if not _pending(conn, path):
        return
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            steps = _pending(conn, path)
            if steps:
                _apply(conn, steps[0])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if len(steps) <= 1:
            return


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _pending(conn: sqlite3.Connection, path: Path) -> list[Migration]:
    return pending(
        "sqlite",
        _user_version(conn),
        where=f"index {path}",
        fix="Run the rlm-mcp release that wrote this data dir (or a newer one), or set RLM_MCP_DATA_DIR to another directory.",
    )


def _apply(conn: sqlite3.Connection, step: Migration) -> None:
    if step.sql is not None:
        for statement in _statements(step.sql):
            conn.execute(statement)
    elif step.function is not None:
        step.function(conn)
    conn.execute(f"PRAGMA user_version = {step.version}")


def _statements(script: str) -> Iterator[str]:
    """The statements of an SQL file, one at a time (`executescript` would commit first)."""
    text = ""
    for line in script.splitlines(keepends=True):
        text += line
        if sqlite3.complete_statement(text):
            yield text.strip()
            text = ""
    if any(line.strip() and not line.strip().startswith("--") for line in text.splitlines()):
        yield text.strip()  # the last statement, without its semicolon


# SQLite's primary result codes for "another connection holds the lock" (extended codes keep them
# in their low byte).
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6


def _would_wait(exc: sqlite3.OperationalError) -> bool:
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def read_here(path: Path, work: Callable[[sqlite3.Connection], T]) -> tuple[T] | None:
    """`work` as a read on the calling thread (the event loop), in a way that never waits: the
    result in a 1-tuple, or None when it would have to wait, and the caller then reads in a
    worker thread (`in_thread`) as every other operation does.

    A read of one or two rows on an idle connection costs tens of microseconds; the worker-thread
    hop around it 0.3-1.5 ms on a loaded 2-core host, and a run's admission waits for it. It
    never waits because: the file's schema must already be current in this process (a
    migration takes the write lock), an idle connection must be at hand (opening one may
    recover the WAL, under a lock), and its busy timeout is 0 while it reads (in WAL mode a read
    takes no lock a writer holds, so only a recovery or an exclusive lock would answer busy,
    and those send the read to the worker thread instead of the busy handler)."""
    key = str(path)
    inode = _inode(path)
    with _init_lock:
        if inode == -1 or _initialised.get(key) != inode:
            return None
    conn = _borrow_idle(path, inode)
    if conn is None:
        return None
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            result = work(conn)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    except sqlite3.OperationalError as exc:
        conn.close()  # its state is unknown: never lent again
        if _would_wait(exc):
            return None
        raise
    except BaseException:
        conn.close()
        raise
    _give_back(path, conn, inode)
    return (result,)


@contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection for reads (autocommit); given back (or closed) on exit."""
    inode = _ensure_schema(path)
    conn = _borrow(path, inode)
    try:
        yield conn
    except BaseException:
        conn.close()  # its state is unknown: never lent again
        raise
    _give_back(path, conn, inode)


_writer_locks: dict[str, threading.Lock] = {}


def _writer_lock(path: Path) -> threading.Lock:
    with _init_lock:
        return _writer_locks.setdefault(str(path), threading.Lock())


@contextmanager
def write_txn(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection inside BEGIN IMMEDIATE: committed on success, rolled back on error.

    This process's writers queue on a mutex first: SQLite's busy handler polls with sleeps of
    1 to 100 ms, so 16 runs pinning their contexts at once spent longer asleep than writing.
    Writers in other processes still meet the busy handler, as before.
    """
    with _writer_lock(path), connect(path) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


async def in_thread(func: Callable[[], T]) -> T:
    """Blocking file/SQLite work off the event loop. Not cancellable midway: a half-done
    transaction would be rolled back anyway, but a half-written file must reach its rename
    or its cleanup, so the thread always runs to the end."""
    return await anyio.to_thread.run_sync(func)


# --- process identity, for pins other processes can judge ------------------------------------

HOST = socket.gethostname()


def proc_start(pid: int) -> str | None:
    """Start time of a process (Linux /proc), so a recycled pid is not mistaken for the owner."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after its closing ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def pid_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if start is not None:
        current = proc_start(pid)
        if current is not None and current != start:
            return False
    return True
