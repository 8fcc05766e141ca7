"""The team's throttle channel (`ports.throttle.ThrottleChannel`) on PostgreSQL LISTEN/NOTIFY:
no table, no migration. A worker whose LM endpoint answered 429/503 publishes its cut here; every
process that listens cuts its own limit for that endpoint and model (lm/throttle.py). NOTIFY may
lose a note while a listener reconnects: the listener then learns from the endpoint's own answers."""

from __future__ import annotations

from collections.abc import Callable

from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.workers import listen_forever

THROTTLE_CHANNEL = "rlm_lm_throttle"  # payload: lm/throttle.py's JSON note (endpoint, model, limit)
_NOTIFY = "SELECT pg_notify(%(channel)s, %(note)s)"


class PgThrottleChannel:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def publish(self, note: str) -> None:
        async with self._db.connection() as conn:
            await conn.execute(_NOTIFY, {"channel": THROTTLE_CHANNEL, "note": note})

    async def listen(self, on_note: Callable[[str], None], *, on_connect: Callable[[], object]) -> None:
        await listen_forever(self._db.url, THROTTLE_CHANNEL, on_note, on_connect=on_connect)
