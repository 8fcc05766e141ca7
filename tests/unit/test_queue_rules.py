"""The run queue's rules (tests/fixtures_queue_rules.py) over the in-memory queue
(`rlm_mcp.testing.memory_queue`), its clock moved by the test: the fast tier's share of team
mode's rules. The same rules run over PostgreSQL in tests/postgres/test_queue_rules_pg.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.testing.memory_queue import MemoryRunQueue
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_queue_rules import RULE_IDS, RULES
from tests.fixtures_queue_team import OpenTeam, Team

pytestmark = pytest.mark.anyio


class WallClock:
    """The queue's clock (the database's, in team mode), moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def memory_team(tmp_path: Path) -> OpenTeam:
    @asynccontextmanager
    async def open_team(**overrides: Any) -> AsyncIterator[Team]:
        settings = make_settings(tmp_path, **({"worker_lease_s": 5.0} | overrides))
        clock = WallClock()
        queue = MemoryRunQueue(queue_rules(settings.queue), clock=clock)

        async def silence(worker: int) -> None:
            queue.silence(worker)

        async def set_lm_called(run_id: str, value: bool) -> None:
            queue.set_lm_called(run_id, value)

        async def age_queued(seconds: float) -> None:
            queue.age_queued(seconds)

        async def event_attempts(run_id: str) -> list[int]:
            return [attempt for attempt, _, _ in queue.events.get(run_id, [])]

        async def pass_time(seconds: float) -> None:
            clock.now += seconds

        async with make_stores(settings) as stores:  # embedded: SQLite and files
            yield Team(queue, queue, settings, silence, set_lm_called, age_queued, event_attempts, pass_time, stores)

    return open_team


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
async def test_queue_rule(rule: Callable[[OpenTeam], Awaitable[None]], tmp_path: Path) -> None:
    await rule(memory_team(tmp_path))
