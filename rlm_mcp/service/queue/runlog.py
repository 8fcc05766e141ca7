"""A worker's run log: the PostgreSQL log, plus the run's `lm_called` mark.

The mark is written as soon as the first answered LM call's event (`LLMCall` without an error)
is recorded, before the run goes on, so "no LM reply recorded" (the only runs the sweepers queue
again after their worker is lost; `records.had_lm_reply` reads the same from the log) holds with
no reporting delay in between.
"""

from __future__ import annotations

import logging
from typing import Any

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import LLMCall, RunEvent
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.runs import PgRunLog

log = logging.getLogger("rlm_mcp.queue")


class QueueRunLog:
    """`store.ports.RunLogPort` over a `PgRunLog`."""

    def __init__(self, inner: PgRunLog, db: Database) -> None:
        self._inner = inner
        self._db = db
        self._marked = False

    @property
    def run_id(self) -> str:
        return self._inner.run_id

    async def open(self) -> None:
        await self._inner.open()

    async def append(self, event: RunEvent) -> None:
        await self._inner.append(event)
        if not self._marked and isinstance(event, LLMCall) and event.error is None:  # an answered call
            try:
                async with self._db.connection() as conn:
                    await conn.execute("UPDATE rlm_runs SET lm_called = true WHERE run_id = %s", (self.run_id,))
                self._marked = True
            except RlmMcpError as exc:  # the database is away: the next LM reply tries again
                log.info("could not mark run %s as having called the LM: %s", self.run_id, exc)

    async def write_summary(self, summary: dict[str, Any]) -> None:
        await self._inner.write_summary(summary)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def detach(self) -> None:
        self._inner.detach()
