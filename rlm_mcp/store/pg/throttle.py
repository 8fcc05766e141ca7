"""The team's throttle channel (`ports.throttle.ThrottleChannel`) on PostgreSQL LISTEN/NOTIFY:
no table, no migration. A worker whose LM endpoint answered 429/503 publishes its cut here; every
process that listens cuts its own limit for that endpoint and model (lm/throttle.py). NOTIFY may
lose a note while a listener reconnects: the listener then learns from the endpoint's own answers.
The same channel class carries the workers' gate states to the fronts' viewers on a channel of its
own (`THROTTLE_STATE_CHANNEL`, lm/throttle_board.py)."""

from __future__ import annotations

from collections.abc import Callable

from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.workers import listen_forever

THROTTLE_CHANNEL = "rlm_lm_throttle"  # payload: lm/throttle.py's JSON note (endpoint, model, limit)
THROTTLE_STATE_CHANNEL = "rlm_lm_throttle_state"  # payload: lm/throttle_board.py's note (a worker's gates)
_NOTIFY = "SELECT pg_notify(%(channel)s, %(note)s)"


class PgThrottleChannel:
    def __init__(self, db: Database, channel: str = THROTTLE_CHANNEL) -> None:
        self._db = db
        self._channel = channel

    async def publish(self, note: str) -> None:
        async with self._db.connection() as conn:
            await conn.execute(_NOTIFY, {"channel": self._channel, "note": note})

    async def listen(self, on_note: Callable[[str], None], *, on_connect: Callable[[], object]) -> None:
        await listen_forever(self._db.url, self._channel, on_note, on_connect=on_connect)
