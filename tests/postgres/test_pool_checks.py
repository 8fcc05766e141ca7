"""When the pool checks a connection before lending it (store/pg/lending.py `Lending.check`): the
check's round trip is skipped for a connection given back healthy within QUIET_S whose socket has
nothing to read, and never after a failure until the connection has come back healthy again. The
clock is the test's; the stand-in connections' sockets are one end of a socket pair."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from rlm_mcp.store.pg import db as db_module
from rlm_mcp.store.pg import lending as lending_module
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.lending import ANSWERED_S, QUIET_S
from tests.fixtures_postgres import Cluster

pytestmark = pytest.mark.anyio


_PAIRS: list[tuple[socket.socket, socket.socket]] = []


class _PgConn:
    def __init__(self) -> None:
        self.ours, self.server = socket.socketpair()
        _PAIRS.append((self.ours, self.server))

    @property
    def socket(self) -> int:
        return self.ours.fileno()


class _Stand:
    """Stands in for a pooled connection: `_check` keys its bookkeeping on it and looks at its
    socket (`pgconn.socket`), whose other end (`server`) plays the database's."""

    broken = False

    def __init__(self) -> None:
        self.pgconn = _PgConn()

    @property
    def server(self) -> socket.socket:
        return self.pgconn.server


def _Conn() -> Any:
    return _Stand()


@pytest.fixture(autouse=True)
def _closed_pairs() -> Iterator[None]:
    yield
    while _PAIRS:
        for end in _PAIRS.pop():
            end.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


URL = "postgresql://u@127.0.0.1:1/x"  # never opened: no server needed


def _unopened(monkeypatch: pytest.MonkeyPatch) -> tuple[Database, _Clock]:
    """A pool that is never opened, its lending on the test's clock."""
    clock = _Clock()
    monkeypatch.setattr(lending_module, "time", clock)
    return Database(URL, replica=False), clock


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    seen: list[object] = []

    async def check_connection(conn: object) -> None:
        seen.append(conn)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(check_connection))
    return seen


async def test_a_quiet_recent_connection_is_lent_unchecked(
    checked: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, clock = _unopened(monkeypatch)
    old, recent, never = _Conn(), _Conn(), _Conn()
    db.lending.returned(old)
    clock.now += QUIET_S / 2
    db.lending.returned(recent)
    clock.now += QUIET_S / 2 + 0.1
    await db.lending.check(recent)  # given back within QUIET_S, nothing to read
    await db.lending.check(old)  # idle past QUIET_S
    await db.lending.check(never)  # never came back healthy
    assert checked == [old, never]


@pytest.mark.parametrize("said", ["an error message", "end of stream"])
async def test_a_connection_the_server_spoke_on_or_closed_is_checked(
    checked: list[object], monkeypatch: pytest.MonkeyPatch, said: str
) -> None:
    """A server ending a session (a restart, `pg_terminate_backend`) writes its FATAL message and
    closes: the socket of an idle connection is readable, and the round trip is made."""
    db, clock = _unopened(monkeypatch)
    ended, quiet = _Conn(), _Conn()
    db.lending.returned(ended)
    db.lending.returned(quiet)
    if said == "end of stream":
        ended.server.close()
    else:
        ended.server.sendall(b"E\0\0\0\x08FATAL\0")
    await db.lending.check(quiet)
    await db.lending.check(ended)
    assert checked == [ended]


async def test_after_a_failure_every_connection_is_checked(
    checked: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, clock = _unopened(monkeypatch)
    a, b = _Conn(), _Conn()
    db.lending.returned(a)
    db.lending.returned(b)
    with pytest.raises(db_module.DatabaseUnavailableError):
        async with db.connection():  # the pool is not open: a failure, as a restart would give
            pass
    await db.lending.check(a)
    await db.lending.check(b)
    assert checked == [a, b]


async def test_a_connection_that_came_back_broken_is_checked_before_it_is_lent_again(
    checked: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, clock = _unopened(monkeypatch)
    healthy, broken = _Conn(), _Conn()
    broken.broken = True
    db.lending.returned(healthy)
    db.lending.returned(broken)
    await db.lending.check(healthy)
    await db.lending.check(broken)
    assert checked == [broken]


async def test_a_statement_answered_lately_stands_for_the_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The health route's `ping` runs no `SELECT 1` while a connection came back healthy within
    ANSWERED_S; past it, or after a failure, it asks the database (never opened here: it fails)."""
    db, clock = _unopened(monkeypatch)
    assert not await db.ping()  # nothing answered yet: its own statement, which fails
    db.lending.returned(_Conn())
    clock.now += ANSWERED_S / 2
    assert await db.ping()
    clock.now += ANSWERED_S
    assert not await db.ping()
    db.lending.returned(_Conn())
    with pytest.raises(db_module.DatabaseUnavailableError):
        async with db.connection():  # a failure forgets the answer at once
            pass
    assert not await db.ping()


async def test_a_session_the_server_ended_is_replaced_before_the_next_statement(
    pg_cluster: Cluster, pg_url: str
) -> None:
    """The real thing: a pooled connection's session ended by the server (as a restart ends them
    all) is not lent: the next statement runs on a new session instead of failing."""
    db = Database(pg_url, replica=False, max_size=1)
    await db.open()
    try:
        async with db.connection() as conn:
            ended = await _backend_pid(conn)
        # Returns once the session has ended (its FATAL message written, its socket closed).
        pg_cluster.sql(f"SELECT pg_terminate_backend({ended}, 10000)")
        async with db.connection() as conn:
            assert await _backend_pid(conn) != ended
    finally:
        await db.close()


async def _backend_pid(conn: Any) -> int:
    row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
    return int(row["pid"])


async def test_a_pool_sharing_its_answers_stands_for_the_other_s_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue's pool shares the store's `Answers`: a worker's heartbeats on it spare the health
    route its `SELECT 1` on the store's pool; a failure on either forgets the answer for both."""
    store, clock = _unopened(monkeypatch)
    queue = Database(URL, replica=False, answers=store.answers)
    queue.lending.returned(_Conn())
    clock.now += ANSWERED_S / 2
    assert await store.ping()  # no statement of its own (it would fail: never opened)
    with pytest.raises(db_module.DatabaseUnavailableError):
        async with queue.connection():
            pass
    assert not await store.ping()


async def test_the_replica_beat_stamps_its_row_and_forgets_day_old_replicas_in_one_statement(pg_url: str) -> None:
    db = Database(pg_url, replica=True)
    await db.open()  # its first beat
    try:
        async with db.connection() as conn:
            await conn.execute(
                "INSERT INTO rlm_replicas VALUES ('gone-1', 'h', 1, 'v', 0, extract(epoch FROM now()) - 90000), "
                "('quiet-1', 'h', 2, 'v', 0, extract(epoch FROM now()) - 600)"
            )
            # This one's own row, silent a day too (a process paused that long): stamped, not removed.
            await conn.execute("UPDATE rlm_replicas SET seen_at = 0 WHERE replica_id = %s", (db.replica_id,))
        await db._beat()
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT replica_id, seen_at > extract(epoch FROM now()) - 5 AS fresh FROM rlm_replicas ORDER BY replica_id"
            )
            rows = {r["replica_id"]: r["fresh"] for r in await cur.fetchall()}
        assert rows == {db.replica_id: True, "quiet-1": False}
    finally:
        await db.close()
