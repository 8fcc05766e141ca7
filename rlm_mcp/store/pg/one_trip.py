"""A locked transaction in one round trip (psycopg's pipeline mode): its BEGIN, a lock statement,
the statement the lock guards and the COMMIT go out together and their answers come back at
once, so the process waits for the database, and wakes for its answer, once; and the lock is held
only while the database runs the two statements, never while this process's event loop gets
round to sending the next one.

The statements still run one after another, in order, each with its own snapshot: the statement
after an advisory lock sees every write committed by those who held the lock before. A statement
that fails aborts the rest (the COMMIT included): the transaction is rolled back here, and the
error raised, as when they went one at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import anyio
import psycopg

from rlm_mcp.store.pg.db import Conn

__all__ = ["locked_in_one_trip"]


async def locked_in_one_trip(
    conn: Conn, lock: str, lock_params: Mapping[str, Any], statement: str, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """`statement` in a transaction of its own on `conn` (an autocommit connection), after `lock`
    (a statement that takes a transaction-level lock), in one round trip; the statement's rows."""
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            await conn.execute(lock, lock_params)
            cur = await conn.execute(statement, params)
            await conn.execute("COMMIT")
    except BaseException:
        # A broken connection cannot roll back: the pool discards it on its return.
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error):
                await conn.rollback()
        raise
    return list(await cur.fetchall()) if cur.description is not None else []
