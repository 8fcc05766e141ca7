"""A transaction on the embedded SQLite index (`store._db`), driven from async code.

The store's rules are async (they run over PostgreSQL too); SQLite is blocking, so every step of
a transaction runs in a worker thread, in order, on one connection. Round trips to a thread cost
more than the statements, so a transaction takes as few as it can:

* the connection (and, for a write, BEGIN IMMEDIATE: the lock) is taken by the first step, on
  the shared worker threads, where a writer may wait for the lock;
* statements without results (`execute`) are sent with the next step, at the latest with the
  COMMIT; the later steps run on threads of the transaction's own (a private capacity limiter),
  so writers queued on the lock can never starve the holder of threads.

The transaction's `now` is this process's clock (`clock`), read once: every process on the data
dir shares the host's clock.

Leaving the block commits (or, when it raises, rolls back) and gives the connection back,
shielded from cancellation; a step already in a thread always runs to its end.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio

from rlm_mcp.owners import Owner
from rlm_mcp.store import _db
from rlm_mcp.store.index import Row

__all__ = ["SqliteTx", "transaction"]

T = TypeVar("T")
Tx = TypeVar("Tx", bound="SqliteTx")


def _nothing(conn: sqlite3.Connection) -> None:
    return None


class SqliteTx:
    """The steps of one transaction on the index at `db_path` (see the module's docstring)."""

    def __init__(self, db_path: Path, *, write: bool, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._now: float | None = None
        self._cm: AbstractContextManager[sqlite3.Connection] = _db.write_txn(db_path) if write else _db.connect(db_path)
        self._conn: sqlite3.Connection | None = None
        self._pending: list[tuple[str, Sequence[Any]]] = []
        self._limiter = anyio.CapacityLimiter(1)

    def _step(self, func: Callable[[sqlite3.Connection], T]) -> T:
        """In a worker thread: enter the transaction if not yet, send what is pending, run `func`."""
        if self._conn is None:
            self._conn = self._cm.__enter__()
        pending, self._pending = self._pending, []
        for sql, params in pending:
            self._conn.execute(sql, params)
        return func(self._conn)

    async def run(self, func: Callable[[sqlite3.Connection], T]) -> T:
        """Blocking work of this transaction (statements, file moves under its lock) in a worker thread."""
        limiter = self._limiter if self._conn is not None else None  # None: the shared threads
        return await anyio.to_thread.run_sync(self._step, func, limiter=limiter)

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return await self.run(lambda conn: conn.execute(sql, params).fetchone())

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self.run(lambda conn: conn.execute(sql, params).fetchall())

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._pending.append((sql, tuple(params)))  # sent with the next step

    async def now(self) -> float:
        if self._now is None:
            self._now = self._clock()
        return self._now

    async def lock_owner(self, owner: Owner) -> None:
        return None  # the write transaction already excludes every other writer

    def _finish(self, exc: BaseException | None) -> None:
        if exc is not None:
            if self._conn is not None:
                self._cm.__exit__(type(exc), exc, exc.__traceback__)
            return
        try:
            self._step(_nothing)
        except BaseException as err:
            if self._conn is not None:
                self._cm.__exit__(type(err), err, err.__traceback__)
            raise
        self._cm.__exit__(None, None, None)

    async def finish(self, exc: BaseException | None) -> None:
        """Commit (`exc` None) or roll back, and give the connection back."""
        if self._conn is None and (exc is not None or not self._pending):
            return  # never entered, nothing to send
        limiter = self._limiter if self._conn is not None else None
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._finish, exc, limiter=limiter)


@asynccontextmanager
async def transaction(tx: Tx) -> AsyncIterator[Tx]:
    try:
        yield tx
    except BaseException as exc:
        await tx.finish(exc)
        raise
    await tx.finish(None)
