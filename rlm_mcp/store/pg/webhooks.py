"""The webhook outbox of team mode: `rlm_webhook_outbox` (migration 0009; `ports.webhooks`: the
rules). Every front's and worker's deliverer claims due rows with `FOR UPDATE SKIP LOCKED` and a
lease, so a run end is delivered while any process of the team runs."""

from __future__ import annotations

from dataclasses import astuple

from rlm_mcp.owners import EVERY_OWNER, OwnerScope
from rlm_mcp.ports.webhooks import Attempt, Delivery
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.webhooks import COLUMNS, delivery_of, record_params

# An attempt's outcome written back, its claim released (parameters: `record_params`).
_RECORD = (
    "UPDATE rlm_webhook_outbox SET state = %s, attempts = %s, next_at = %s, last_status = %s, "
    "last_error = %s, delivered_at = CASE WHEN %s = 'delivered' THEN %s ELSE delivered_at END, "
    "claimed_until = NULL WHERE webhook_id = %s"
)


class PgWebhookOutbox:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, delivery: Delivery) -> bool:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                f"INSERT INTO rlm_webhook_outbox ({COLUMNS}) VALUES "
                "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                astuple(delivery),
            )
            return cur.rowcount == 1

    async def claim(self, now: float, lease_s: float, limit: int) -> list[Delivery]:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "UPDATE rlm_webhook_outbox SET claimed_until = %s WHERE webhook_id IN (SELECT webhook_id FROM "
                "rlm_webhook_outbox WHERE state = 'pending' AND next_at <= %s AND coalesce(claimed_until, 0) < %s "
                f"ORDER BY next_at LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {COLUMNS}",
                (now + lease_s, now, now, limit),
            )
            return [delivery_of(r) for r in await cur.fetchall()]

    async def record(self, webhook_id: str, attempt: Attempt) -> None:
        async with self._db.connection() as conn:
            await conn.execute(_RECORD, record_params(webhook_id, attempt))

    async def list(self, owner: OwnerScope, limit: int) -> list[Delivery]:
        async with self._db.connection() as conn:
            if owner is EVERY_OWNER:
                cur = await conn.execute(
                    f"SELECT {COLUMNS} FROM rlm_webhook_outbox ORDER BY created_at DESC LIMIT %s", (max(0, limit),)
                )
            else:
                cur = await conn.execute(
                    f"SELECT {COLUMNS} FROM rlm_webhook_outbox WHERE owner = %s ORDER BY created_at DESC LIMIT %s",
                    (str(owner), max(0, limit)),
                )
            return [delivery_of(r) for r in await cur.fetchall()]

    async def redeliver(self, webhook_id: str, owner: OwnerScope, now: float) -> bool:
        query = (
            "UPDATE rlm_webhook_outbox SET state = 'pending', next_at = %s, claimed_until = NULL WHERE webhook_id = %s"
        )
        params: tuple[object, ...] = (now, webhook_id)
        if owner is not EVERY_OWNER:
            query += " AND owner = %s"
            params += (str(owner),)
        async with self._db.connection() as conn:
            cur = await conn.execute(query, params)
            return cur.rowcount == 1

    async def prune(self, before: float) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM rlm_webhook_outbox WHERE state IN ('delivered', 'failed') AND created_at < %s", (before,)
            )
            return cur.rowcount
