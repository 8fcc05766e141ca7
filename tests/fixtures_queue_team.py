"""What the queue's rules run on (tests/fixtures_queue_rules.py): a `Team` is a fresh queue
(the in-memory one or PostgreSQL's), its fenced run logs, the stores a worker executes with, and
what a test does to the state from outside (a worker falls silent, queued runs age, time passes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.ports.queue import FencedRunStore, RunQueuePort
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.service.queue.sweeper import Sweeper
from rlm_mcp.store.bundle import Stores
from tests.fixtures_store import run_record

__all__ = ["Clock", "OpenTeam", "Team", "connected_sweeper", "final", "summary"]


@dataclass
class Team:
    queue: RunQueuePort
    logs: FencedRunStore
    settings: Settings
    silence: Callable[[int], Awaitable[None]]  # the worker's heartbeat an hour old
    set_lm_called: Callable[[str, bool], Awaitable[None]]
    age_queued: Callable[[float], Awaitable[None]]  # every queued run waited this much longer
    event_attempts: Callable[[str], Awaitable[list[int]]]  # the attempt of each logged event
    pass_time: Callable[[float], Awaitable[None]]  # the queue's clock moves on (PostgreSQL: a sleep)
    stores: Stores  # the contexts and run records a worker executes runs with


OpenTeam = Callable[..., AbstractAsyncContextManager[Team]]


def summary(run_id: str, owner: str = "local", query: str = "q", **fields: Any) -> RunRecord:
    limits = {"max_iterations": 5, "max_depth": 1, "timeout_s": 60.0, "token_budget": None, "max_errors": 3}
    stored = {"query": query, "context_ids": [], "owner": owner, "limits": limits, "status": "queued"}
    return run_record(run_id, stored | fields)


def final(run_id: str) -> RunRecord:
    return summary(run_id, status="completed", result={"status": "completed"})


class Clock:
    """A monotonic clock the test moves (the sweeper's view of how long it has been connected)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def connected_sweeper(team: Team, liveness: LeaseLiveness | None = None) -> Sweeper:
    """A sweeper connected for a full lease (it may judge leases), once the database itself has
    been up that long."""
    lease = team.settings.team.worker_lease_s
    with anyio.fail_after(lease + 30):
        while (await team.queue.sweep_look()).up_s < lease:
            await team.pass_time(0.2)
    clock = Clock()
    sweeper = Sweeper(team.settings.queue, team.queue, None, liveness, clock=clock)
    await sweeper.sweep_once()
    clock.now += lease + 1
    return sweeper
