"""Spent one-time codes in PostgreSQL: the book beneath `store.spent_codes.SpentCodes` in team
mode, so a code spent on one replica is spent on all of them.

`INSERT ... ON CONFLICT DO NOTHING` decides: the one replica whose insert adds the row spends the
code, every other (and every later try) finds it there. Rows are dropped a while after their
code expired, by the database's clock (a replica whose own clock runs ahead must not forget the
codes the others still take); `GRACE_S` covers expiry times stamped by replicas' clocks that
disagree by minutes, so no replica still taking a code finds its row gone.
"""

from __future__ import annotations

from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.spent_codes import SpentCodes

GRACE_S = 600.0


class PgCodeBook:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add_if_new(self, digest: str, expires_at: float, now: float) -> bool:
        async with self._db.connection() as conn:  # `now` (this host's clock) is not the shared one
            await conn.execute(
                "DELETE FROM rlm_spent_codes WHERE expires_at < extract(epoch FROM now()) - %s", (GRACE_S,)
            )
            cur = await conn.execute(
                "INSERT INTO rlm_spent_codes VALUES (%s, %s) ON CONFLICT (code_sha256) DO NOTHING RETURNING 1",
                (digest, expires_at),
            )
            return await cur.fetchone() is not None


class PgSpentCodes(SpentCodes):
    def __init__(self, db: Database) -> None:
        super().__init__(PgCodeBook(db))
