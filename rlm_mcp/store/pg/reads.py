"""Small reads every store module shares: the database's clock (`NOW`, `read_now`) and a large
value's chunks in order (`read_chunks`), one statement a chunk."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg

Conn = psycopg.AsyncConnection[dict[str, Any]]  # a pooled connection (rows as dicts); `db` lends them

# The database's clock, which every replica shares: the one time the store's rules compare in
# team mode (`now()`: the transaction's start, the same for each of its statements).
NOW = "SELECT extract(epoch FROM now())::float8 AS now"


async def read_now(cur: psycopg.AsyncCursor[dict[str, Any]]) -> float:
    """The time `NOW` answered on `cur`."""
    row = await cur.fetchone()
    assert row is not None  # SELECT without FROM: one row
    return float(row["now"])


async def read_chunks(
    conn: Conn, query: str, key: str, count: int, *, missing: Callable[[], Exception] | None = None
) -> AsyncIterator[bytes]:
    """Chunks 0 to `count` - 1 of `key`, in order: `query` selects one chunk's `data` by (key,
    idx). One statement a chunk, so a blob, an upload or a snapshot larger than memory streams
    through. A missing chunk (deleted meanwhile) raises `missing()`, or ends the chunks without it."""
    for idx in range(count):
        cur = await conn.execute(query, (key, idx), binary=True)  # bytea as raw bytes, not hex text
        part = await cur.fetchone()
        if part is None:
            if missing is None:
                return
            raise missing()
        yield bytes(part["data"])
