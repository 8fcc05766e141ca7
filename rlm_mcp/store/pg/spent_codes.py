"""One-time codes spent once across every replica (team mode's `SpentCodesPort`).

`INSERT ... ON CONFLICT DO NOTHING` decides: the one replica whose insert adds the row spends the
code, every other (and every later try) finds it there. Rows are dropped a while after their
code expired: `GRACE_S` covers clocks of replicas that disagree by minutes, so no replica still
taking a code finds its row gone.
"""

from __future__ import annotations

import time

from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.spent_codes import code_digest

GRACE_S = 600.0


class PgSpentCodes:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def spend(self, code: str, expires_at: float) -> bool:
        async with self._db.connection() as conn:
            await conn.execute("DELETE FROM rlm_spent_codes WHERE expires_at < %s", (time.time() - GRACE_S,))
            cur = await conn.execute(
                "INSERT INTO rlm_spent_codes VALUES (%s, %s) ON CONFLICT (code_sha256) DO NOTHING RETURNING 1",
                (code_digest(code), expires_at),
            )
            return await cur.fetchone() is not None
