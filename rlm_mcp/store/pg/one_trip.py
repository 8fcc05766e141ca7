"""Transactions of the team queue in fewer round trips (psycopg's pipeline mode): the statements
go out together and their answers come back at once, so the process waits for the database, and
wakes for its answer, once instead of once a statement.

The statements still run one after another, in order, each with its own snapshot: a statement
after an advisory lock still sees every write committed by those who held the lock before. A
statement that fails aborts the rest (the COMMIT included): the transaction is rolled back, and
the error raised, as when they went one at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import anyio
import psycopg

from rlm_mcp.store.pg.db import Conn, Database

__all__ = ["commit_with", "transaction_in_one_trip"]


async def transaction_in_one_trip(
    db: Database, first: str, statement: str, params: Mapping[str, Any]
) -> dict[str, Any] | None:
    """BEGIN, `first` (text without parameters: an advisory lock), `statement` and COMMIT in one
    round trip; `statement`'s first row (None if it returned none)."""
    async with db.connection() as conn:
        try:
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await conn.execute(first)
                cur = await conn.execute(statement, params)
                await conn.execute("COMMIT")
        except BaseException:
            await _roll_back(conn)
            raise
        return await cur.fetchone() if cur.description is not None else None


async def commit_with(conn: Conn, statement: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The open transaction's last statement and its COMMIT in one round trip (the caller's
    `Database.opened_transaction` then has nothing left to commit; it rolls back if this raises);
    the statement's rows."""
    async with conn.pipeline():
        cur = await conn.execute(statement, params)
        await conn.execute("COMMIT")
    return list(await cur.fetchall()) if cur.description is not None else []


async def _roll_back(conn: Conn) -> None:
    # A broken connection cannot roll back: the pool discards it on its return.
    with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error):
        await conn.rollback()
