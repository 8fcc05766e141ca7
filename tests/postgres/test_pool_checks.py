"""When the pool checks a connection before lending it (store/pg/db.py `Database._check`):
psycopg's pool lends its least recently returned connection, so the check is skipped for one
given back within REUSE_S while the pool as a whole answered within FRESH_S, and never after a
failure until the connection has come back healthy again. The clock is the test's."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from rlm_mcp.store.pg import db as db_module
from rlm_mcp.store.pg.db import ANSWERED_S, FRESH_S, REUSE_S, Database

pytestmark = pytest.mark.anyio


class _Stand:
    """Stands in for a pooled connection: `_check` only keys its bookkeeping on it."""

    broken = False


def _Conn() -> Any:
    return _Stand()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    seen: list[object] = []

    async def check_connection(conn: object) -> None:
        seen.append(conn)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(check_connection))
    return seen


async def test_a_recent_connection_is_lent_unchecked_while_the_pool_answers(
    checked: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(db_module, "time", clock)
    db = Database("postgresql://u@127.0.0.1:1/x", replica=False)  # never opened: no server needed
    old, recent, fresh = _Conn(), _Conn(), _Conn()
    db._returned(old)
    clock.now += REUSE_S + 0.1
    db._returned(recent)
    clock.now += REUSE_S / 2
    db._returned(fresh)
    clock.now += FRESH_S / 2
    await db._check(fresh)  # given back within FRESH_S
    await db._check(recent)  # within REUSE_S, and the pool answered within FRESH_S
    await db._check(old)  # idle past REUSE_S
    assert checked == [old]
    clock.now += FRESH_S  # nothing came back since: the pool has not answered lately
    await db._check(recent)
    assert checked == [old, recent]


async def test_after_a_failure_every_connection_is_checked(
    checked: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(db_module, "time", clock)
    db = Database("postgresql://u@127.0.0.1:1/x", replica=False)
    a, b = _Conn(), _Conn()
    db._returned(a)
    db._returned(b)
    with pytest.raises(db_module.DatabaseUnavailableError):
        async with db.connection():  # the pool is not open: a failure, as a restart would give
            pass
    await db._check(a)
    await db._check(b)
    assert checked == [a, b]


async def test_a_connection_that_came_back_broken_is_checked_before_it_is_lent_again(
    checked: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(db_module, "time", clock)
    db = Database("postgresql://u@127.0.0.1:1/x", replica=False)
    healthy, broken = _Conn(), _Conn()
    broken.broken = True
    db._returned(healthy)
    db._returned(broken)
    await db._check(healthy)
    await db._check(broken)
    assert checked == [broken]


async def test_a_statement_answered_lately_stands_for_the_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The health route's `ping` runs no `SELECT 1` while a connection came back healthy within
    ANSWERED_S; past it, or after a failure, it asks the database (never opened here: it fails)."""
    clock = _Clock()
    monkeypatch.setattr(db_module, "time", clock)
    db = Database("postgresql://u@127.0.0.1:1/x", replica=False)
    assert not await db.ping()  # nothing answered yet: its own statement, which fails
    db._returned(_Conn())
    clock.now += ANSWERED_S / 2
    assert await db.ping()
    clock.now += ANSWERED_S
    assert not await db.ping()
    db._returned(_Conn())
    with pytest.raises(db_module.DatabaseUnavailableError):
        async with db.connection():  # a failure forgets the answer at once
            pass
    assert not await db.ping()
