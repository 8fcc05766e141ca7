"""The claim's transaction in fewer round trips (psycopg's pipeline mode): the statements
go out together and their answers come back at once, so the process waits for the database, and
wakes for its answer, once instead of once a statement.

The statements still run one after another, in order, each with its own snapshot: a statement
after an advisory lock still sees every write committed by those who held the lock before. A
statement that fails aborts the rest (the COMMIT included): the transaction is rolled back, and
the error raised, as when they went one at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlm_mcp.store.pg.db import Conn

__all__ = ["commit_with"]


async def commit_with(conn: Conn, statement: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The open transaction's last statement and its COMMIT in one round trip (the caller's
    `Database.opened_transaction` then has nothing left to commit; it rolls back if this raises);
    the statement's rows."""
    async with conn.pipeline():
        cur = await conn.execute(statement, params)
        await conn.execute("COMMIT")
    return list(await cur.fetchall()) if cur.description is not None else []
