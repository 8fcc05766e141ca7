"""The PostgreSQL connection pool of one process, its errors, and this replica's heartbeat.

psycopg 3's async pool checks a connection before lending it (`check_connection`, a round trip)
unless `lending.Lending` says it need not (it came back healthy lately, and its socket is quiet), so a
PostgreSQL restart costs the next calls a reconnect, never a process restart. A call that cannot
get a connection within `CONNECT_TIMEOUT_S` fails with `DatabaseUnavailableError`, which names
the host and the fix and never the password (nor the URL, which may carry it); a statement
refused for lack of disk or memory fails with `DatabaseResourceError` (`faults`), remembered for
`FAULT_HOLD_S` so the health route reports it. `open` refuses, in one line with the fix, a
database not encoded in UTF8 and a role that may not create the tables it still needs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from rlm_mcp import __version__
from rlm_mcp.database_url import redact
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.store.pg.connect import Connection
from rlm_mcp.store.pg.faults import (
    DatabaseResourceError,
    DatabaseUnavailableError,
    encoding_problem,
    grants_error,
    may_create_tables,
    privilege_error,
    resource_error,
)
from rlm_mcp.store.pg.lending import Answers, Lending
from rlm_mcp.store.pg.migrations import LATEST, SchemaError, migrate, schema_version
from rlm_mcp.store.pg.reads import NOW, Conn, read_now
from rlm_mcp.ticks import sleep_to_tick

log = logging.getLogger("rlm_mcp.store")

__all__ = [
    "Conn",
    "Database",
    "DatabaseResourceError",
    "DatabaseUnavailableError",
    "SchemaError",
    "describe",
    "redact",
]

CONNECT_TIMEOUT_S = 10.0
# How often this replica writes its row in rlm_replicas (its pins stay live while the row is fresher
# than REPLICA_TTL_S) and sweeps its blob cache; not the progress heartbeat of a run
# (service.progress.HEARTBEAT_S).
REPLICA_BEAT_S = 5.0
PING_TIMEOUT_S = 2.0
REPLICA_TTL_S = 60.0  # a replica silent this long is gone: its pins lapse
POOL_MAX = 16  # a replica's store connections at most
FAULT_HOLD_S = 30.0  # after a disk-full (or out-of-memory) refusal, the health route reports it this long

# Several statements without parameters go in one simple-protocol message: one round trip.
_BEGIN_AT = "BEGIN; " + NOW


def describe(url: str) -> str:
    """user@host:port/dbname of a connection URL: safe to show (no password)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the database in RLM_MCP_DATABASE_URL"
    host = parts.get("host") or "localhost"
    if str(host).startswith("/"):
        host = f"socket {host}"
    return f"{parts.get('user') or 'default user'}@{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


class Database:
    """The pool, opened by `open` (migrations first, under an advisory lock)."""

    def __init__(
        self, url: str, *, replica: bool, max_size: int = POOL_MAX, min_size: int = 1, answers: Answers | None = None
    ) -> None:
        """`answers`: another pool's of this process on the same database (the queue's beside the
        store's), so that either's statements stand for the health route's `SELECT 1`."""
        self._url = url
        self.where = describe(url)
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._replica = replica
        self.lending = Lending(answers if answers is not None else Answers())
        self.pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            url,
            # Kept open (psycopg opens them in the background after `open`, and its idle shrinking
            # stops at min_size): `min_size` > 1 spares a burst of runs one connection handshake
            # each, opened one at a time while their statements wait (`make_pg_stores`'s `warm`).
            min_size=min(min_size, max_size),
            max_size=max_size,
            open=False,
            connection_class=Connection,  # an attempt given up on closes its socket at once (connect.py)
            timeout=CONNECT_TIMEOUT_S,
            check=self.lending.check,
            # No `reset`: the pool would hand every returned connection to its worker task (a
            # task switch per statement); `connection` notes the return itself (`Lending.returned`).
            kwargs={"row_factory": dict_row, "autocommit": True, "connect_timeout": int(CONNECT_TIMEOUT_S)},
            reconnect_timeout=0,  # keep trying in the background after an outage, never give up
            name="rlm-mcp",
        )
        # One slot per connection the pool may lend: a caller beyond them waits here, in line, on
        # one future (psycopg_pool's own wait wraps each waiter in a task with its own timer, about
        # five loop callbacks, where a burst of runs queues on a front's small queue pool); taken
        # without a yield when a slot is free (`connection`).
        self._slots = anyio.Semaphore(max_size, fast_acquire=True)
        self.schema_version = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self.on_heartbeat: list[Any] = []  # async callables run after each heartbeat (cache sweep)
        self._fault: tuple[str, float] | None = None  # the last resource refusal and when

    @property
    def answers(self) -> Answers:
        """When this pool's connections (and those of the pools sharing it) last answered."""
        return self.lending.answers

    @property
    def url(self) -> str:
        """The database's URL (the queue's listeners open connections of their own to it)."""
        return self._url

    def unavailable(self, exc: BaseException) -> DatabaseUnavailableError:
        """The one mapping of a driver failure: out of disk or memory (SQLSTATE class 53), or unreachable."""
        if (full := resource_error(exc, self.where, self._url)) is not None:
            self._fault = (full.condition, time.monotonic())
            log.error("%s %s", full.cause, full.fix)
            return full
        detail = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, self._url)
        return DatabaseUnavailableError(
            f"The database {self.where} is unreachable ({detail}).",
            "Check that PostgreSQL is running and reachable from this server and that RLM_MCP_DATABASE_URL "
            "(user, password, host, port, database) is right; `rlm-mcp doctor` checks it. PostgreSQL also "
            "stops when its disk is full (it cannot write its WAL): check its log.",
        )

    def fault(self) -> str | None:
        """ "disk full" (or "out of memory", "out of resources") while a statement was refused so
        within the last `FAULT_HOLD_S`; None otherwise (the health route)."""
        if self._fault is None or time.monotonic() - self._fault[1] > FAULT_HOLD_S:
            return None
        return self._fault[0]

    async def open(self) -> None:
        await self.prepare()
        await self.pool.open(wait=False)
        if self._replica:
            await self._beat()
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            self._tg.start_soon(self._heartbeat)

    async def prepare(self) -> None:
        """The first connection: refuse a database not in UTF8, create or migrate the schema.
        Every failure is one `RlmMcpError` naming the cause and the fix (`serve` checks it before
        it starts anything, so a misconfigured database is one line, never a traceback)."""
        try:
            async with await Connection.connect(
                self._url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S)
            ) as conn:
                if (problem := await encoding_problem(conn, self.where)) is not None:
                    raise problem
                self.schema_version = await self._migrate(conn)
        except psycopg.Error as exc:  # every driver failure, so none prints its own text (or a traceback)
            if getattr(exc, "sqlstate", None) == "42501":
                raise privilege_error(self.where, *(await self._role())) from None
            raise self.unavailable(exc) from None

    async def _migrate(self, conn: Conn | psycopg.AsyncConnection[Any]) -> int:
        """The schema's version after migrating; a current schema is only read (a role that may
        not create tables can serve one), a pending one needs a role that may."""
        try:
            if await schema_version(conn) == LATEST:
                return LATEST
        except psycopg.errors.InsufficientPrivilege:
            _, role, schema = await may_create_tables(conn)
            raise grants_error(self.where, role, schema) from None
        allowed, role, schema = await may_create_tables(conn)
        if not allowed:
            raise privilege_error(self.where, role, schema)
        return await migrate(conn, where=f"database {self.where}")

    async def _role(self) -> tuple[str, str]:
        """(role, schema) of a fresh connection, for the privilege error; placeholders if that fails."""
        try:
            async with await Connection.connect(
                self._url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S)
            ) as conn:
                _, role, schema = await may_create_tables(conn)
                return role, schema
        except psycopg.Error:
            return "of RLM_MCP_DATABASE_URL", "public"

    async def close(self) -> None:
        tg, self._tg = self._tg, None
        if tg is not None:  # exited first, outside any scope entered after it
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        with anyio.CancelScope(shield=True):
            if tg is not None:
                try:
                    async with self.parting_connection() as conn:
                        await conn.execute("DELETE FROM rlm_replicas WHERE replica_id = %s", (self.replica_id,))
                except RlmMcpError:
                    pass
            await self.pool.close()
            self.lending.closed()

    @asynccontextmanager
    async def parting_connection(self) -> AsyncIterator[Conn]:
        """A connection of its own (not the pool's) for a stopping process's last statements.

        A replica stopped by a signal cleans up after its server's main task has returned, while
        asyncio.run's last step cancels every task left, the pool's own among them: the pool
        then lends a connection already idle in it and opens no other. A statement in flight at
        that moment (a heartbeat, a worker's timed look) is cancelled and its connection
        discarded, so a clean-up that asked the pool waited its whole timeout (10 s) for nothing
        and was dropped (tests/postgres/test_team_stop.py)."""
        try:
            async with await Connection.connect(
                self._url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S), row_factory=dict_row
            ) as conn:
                yield conn
        except psycopg.OperationalError as exc:
            raise self.unavailable(exc) from None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A pooled connection (autocommit; use `conn.transaction()` for several statements)."""
        try:
            # The pool's own `connection()` also enters the connection's context, whose exit
            # asks for a commit or a rollback under the connection's lock: nothing to do on an
            # autocommit connection, yet a cost at every statement. Transactions end themselves
            # (`conn.transaction()`, `clocked_transaction`); one left open is rolled back by the
            # pool when the connection comes back.
            conn = await self._lend()
            try:
                yield conn
            finally:
                self.lending.returned(conn)
                try:
                    await self.pool.putconn(conn)
                finally:
                    self._slots.release()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            self.lending.failed()  # one connection failed: check every other before lending it
            raise self.unavailable(exc) from None

    async def _lend(self) -> Conn:
        """A connection from the pool, once a slot is this caller's: within one `CONNECT_TIMEOUT_S`
        for the slot and the pool's answer together (the pool's own bound, as before the slots)."""
        if self._slots.value > 0:  # no yield to take it, so nobody takes it first
            await self._slots.acquire()
            timeout = CONNECT_TIMEOUT_S
        else:
            started = time.monotonic()
            with anyio.move_on_after(CONNECT_TIMEOUT_S) as waiting:
                await self._slots.acquire()
            if waiting.cancelled_caught:  # no slot taken
                raise PoolTimeout(f"couldn't get a connection after {CONNECT_TIMEOUT_S:.2f} sec")
            timeout = max(0.0, started + CONNECT_TIMEOUT_S - time.monotonic())
        try:
            return await self.pool.getconn(timeout=timeout)
        except BaseException:
            self._slots.release()
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        async with self.connection() as conn, conn.transaction():
            yield conn

    @asynccontextmanager
    async def clocked_transaction(self) -> AsyncIterator[tuple[Conn, float]]:
        """A transaction and the database's clock at its start (Unix seconds): the store's rules
        judge ages and grace by the clock every replica shares, never a host's own. The time
        (`now()`, the same for every statement of the transaction) comes back with the BEGIN,
        in one round trip; the block commits when it ends and rolls back when it raises."""
        async with self.connection() as conn:
            cur = await conn.execute(_BEGIN_AT)
            cur.nextset()  # the BEGIN's result, then the SELECT's
            now = await read_now(cur)
            try:
                yield conn, now
            except BaseException:
                # A broken connection cannot roll back: the pool discards it on its return.
                with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error):
                    await conn.rollback()
                raise
            await conn.commit()

    @asynccontextmanager
    async def opened_transaction(self, first: str) -> AsyncIterator[tuple[Conn, dict[str, Any] | None]]:
        """A transaction whose first statement `first` (text without parameters, made of constants)
        goes with its BEGIN in one round trip, as `clocked_transaction`'s clock does; yields the
        connection and that statement's first row (None if it returned none). Commits when the
        block ends, rolls back when it raises."""
        async with self.connection() as conn:
            cur = await conn.execute("BEGIN; " + first)
            cur.nextset()  # the BEGIN's result, then the statement's
            row = await cur.fetchone() if cur.description is not None else None
            try:
                yield conn, row
            except BaseException:
                # A broken connection cannot roll back: the pool discards it on its return.
                with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error):
                    await conn.rollback()
                raise
            await conn.commit()

    async def shared_key(self, name: str) -> bytes:
        """A random 32-byte key, made by whichever replica asks first, the same for all."""
        async with self.connection() as conn:
            await conn.execute(
                "INSERT INTO rlm_secrets VALUES (%s, %b) ON CONFLICT (name) DO NOTHING", (name, secrets.token_bytes(32))
            )
            cur = await conn.execute("SELECT value FROM rlm_secrets WHERE name = %s", (name,), binary=True)
            row = await cur.fetchone()
        assert row is not None  # inserted above unless it was there
        return bytes(row["value"])

    async def ping(self) -> bool:
        """Whether PostgreSQL answered a statement lately (`lending.ANSWERED_S`), or answers `SELECT 1`
        within `PING_TIMEOUT_S` (the health route). Every pooled connection lent out (the pool
        is busy, not the database down) counts as reachable: a replica under load must not drop
        out of its balancer, nor all of them."""
        if self.lending.answered_lately():
            return True
        with anyio.move_on_after(PING_TIMEOUT_S):
            try:
                async with self.pool.connection(timeout=PING_TIMEOUT_S) as conn:
                    await conn.execute("SELECT 1")
                    self.lending.returned(conn)
                return True
            except PoolTimeout:
                return self._all_lent()
            except psycopg.Error:  # PoolClosed, a failed connection: unreachable
                return False
        return self._all_lent()

    def _all_lent(self) -> bool:
        stats = self.pool.get_stats()
        return stats.get("pool_size", 0) >= self.pool.max_size and stats.get("pool_available", 0) == 0

    # --- replicas ------------------------------------------------------------------------

    async def _beat(self) -> None:
        # Stamped by the database's clock: other replicas judge this one's pins by it. The rows of
        # replicas silent for a day go in the same statement (never this one's: the two parts
        # touch different rows).
        async with self.connection() as conn:
            await conn.execute(
                "WITH old AS (DELETE FROM rlm_replicas WHERE seen_at < extract(epoch FROM now()) - %(day)s "
                "AND replica_id <> %(id)s) "
                "INSERT INTO rlm_replicas VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, extract(epoch FROM now()), "
                "extract(epoch FROM now())) ON CONFLICT (replica_id) DO UPDATE SET seen_at = excluded.seen_at",
                {
                    "day": 24 * 3600,
                    "id": self.replica_id,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "version": __version__,
                },
            )

    async def _heartbeat(self) -> None:
        while True:
            await sleep_to_tick(REPLICA_BEAT_S)  # with the process's other 5 s timers (rlm_mcp/ticks.py)
            try:
                await self._beat()
                for hook in self.on_heartbeat:
                    await hook()
            except RlmMcpError as exc:
                log.warning("team mode heartbeat failed: %s", exc)
            except Exception:
                log.exception("team mode heartbeat failed")
