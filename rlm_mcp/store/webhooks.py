"""The webhook outbox of the embedded store: `webhook_outbox` in the data dir's SQLite index
(`ports.webhooks`: the rules). Every process on the data dir may deliver; a claim is a lease."""

from __future__ import annotations

from dataclasses import astuple, fields
from pathlib import Path
from typing import Any

from rlm_mcp.owners import EVERY_OWNER, OwnerScope
from rlm_mcp.ports.webhooks import Attempt, Delivery
from rlm_mcp.store._db import connect, in_thread, write_txn

# The table's columns are `Delivery`'s fields, by name and in order: one list for both stores'
# SQL, their parameters (`astuple`) and the row builder. The columns' types (INTEGER/REAL,
# integer/double precision) already read back as the fields' int and float.
COLUMNS = ", ".join(f.name for f in fields(Delivery))


def delivery_of(row: Any) -> Delivery:
    return Delivery(**{f.name: row[f.name] for f in fields(Delivery)})


def record_params(webhook_id: str, a: Attempt) -> tuple[object, ...]:
    """The parameters of both stores' `record` UPDATE, in its placeholders' order (state twice:
    once to set, once to decide whether `delivered_at` becomes `now`)."""
    return (a.state, a.attempts, a.next_at, a.status, a.error, a.state, a.now, webhook_id)


class SqliteWebhookOutbox:
    def __init__(self, data_dir: Path) -> None:
        self._path = Path(data_dir) / "index.sqlite3"

    async def add(self, delivery: Delivery) -> bool:

        def work() -> bool:
            with write_txn(self._path) as conn:
                cur = conn.execute(
                    f"INSERT INTO webhook_outbox ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    astuple(delivery),
                )
                return cur.rowcount == 1

        return await in_thread(work)

    async def claim(self, now: float, lease_s: float, limit: int) -> list[Delivery]:
        def work() -> list[Delivery]:
            with write_txn(self._path) as conn:
                rows = conn.execute(
                    f"UPDATE webhook_outbox SET claimed_until = ? WHERE webhook_id IN (SELECT webhook_id FROM "
                    "webhook_outbox WHERE state = 'pending' AND next_at <= ? AND coalesce(claimed_until, 0) < ? "
                    f"ORDER BY next_at LIMIT ?) RETURNING {COLUMNS}",
                    (now + lease_s, now, now, limit),
                ).fetchall()
                return [delivery_of(r) for r in rows]

        return await in_thread(work)

    async def record(self, webhook_id: str, attempt: Attempt) -> None:
        def work() -> None:
            with write_txn(self._path) as conn:
                conn.execute(
                    "UPDATE webhook_outbox SET state = ?, attempts = ?, next_at = ?, last_status = ?, last_error = ?, "
                    "delivered_at = CASE WHEN ? = 'delivered' THEN ? ELSE delivered_at END, claimed_until = NULL "
                    "WHERE webhook_id = ?",
                    record_params(webhook_id, attempt),
                )

        await in_thread(work)

    async def list(self, owner: OwnerScope, limit: int) -> list[Delivery]:
        def work() -> list[Delivery]:
            with connect(self._path) as conn:
                where, params = ("", ()) if owner is EVERY_OWNER else ("WHERE owner = ? ", (str(owner),))
                cur = conn.execute(
                    f"SELECT {COLUMNS} FROM webhook_outbox {where}ORDER BY created_at DESC LIMIT ?",
                    (*params, max(0, limit)),
                )
                return [delivery_of(r) for r in cur.fetchall()]

        return await in_thread(work)

    async def redeliver(self, webhook_id: str, owner: OwnerScope, now: float) -> bool:
        def work() -> bool:
            with write_txn(self._path) as conn:
                where, params = ("", ()) if owner is EVERY_OWNER else (" AND owner = ?", (str(owner),))
                cur = conn.execute(
                    "UPDATE webhook_outbox SET state = 'pending', next_at = ?, claimed_until = NULL "
                    f"WHERE webhook_id = ?{where}",
                    (now, webhook_id, *params),
                )
                return cur.rowcount == 1

        return await in_thread(work)

    async def prune(self, before: float) -> int:
        def work() -> int:
            with write_txn(self._path) as conn:
                cur = conn.execute(
                    "DELETE FROM webhook_outbox WHERE state IN ('delivered', 'failed') AND created_at < ?", (before,)
                )
                return cur.rowcount

        return await in_thread(work)
