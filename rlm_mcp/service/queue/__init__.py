"""Team mode's run queue: fronts enqueue runs, workers claim and execute them.

The queue's port and a run's state machine are `ports.queue`; its implementations hold every
statement on run and worker state: `store.pg.queue.PgRunQueue` (team mode, built by the
assembly) and `testing.memory_queue.MemoryRunQueue` (the fast tier's). Here, over the port:
- `front.py`: enqueue, follow a run (progress, status, result), cancel.
- `wakeups.py`: one listener per process that tells the front of each followed run's announcements.
- `sessions.py`: a worker's kept sessions: the live sandboxes it holds, restores, snapshots.
- `worker.py`: claim a run when slots allow, execute it with the local `RunManager`, report,
  fenced by the claim's attempt; `final_writes.py`: how it writes a run's end through an outage
  (handed back, stopped unrecorded, the final record retried); `publishing.py`: a run's live
  summary and log as it goes; `follows.py`: which runs a front follows (their publish interval).
- `sweeper.py`: leases: lost workers' runs and sandboxes, runs no worker takes.
- `liveness.py`: which sandbox owners are gone, by the workers' leases.
- `gauges.py`: the queue's depth, oldest age and live workers, sampled for /metrics.
- `ends.py`: a run's sandbox need and its record when it could not start; `rules.py`: the
  queue's rules from the settings (bounds, lease, each owner's share of the slots).

- `local.py`: a `both` replica's local lane: the runs its front starts go to its own worker when it
  has room, through the queue all the same, and are followed in-process.

Roles (RLM_MCP_ROLE): `front` follows and enqueues, `worker` executes, `both` does both; even in
`both` a run goes through the queue (its claim, fencing and recovery are any run's): offered to
this process's worker first when it has room (RLM_MCP_QUEUE_LOCAL_FIRST), else to any worker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.ports.queue import FencedRunStore, RunQueuePort
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.gauges import sample_forever
from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.service.queue.local import LocalLane
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.sessions import WorkerSessions
from rlm_mcp.service.queue.sweeper import Sweeper
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.queue.worker import QueueWorker
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.ports import ContextStorePort, RunStorePort

__all__ = [
    "CLOCK_SKEW_WARN_S",
    "QueueFront",
    "QueueWorker",
    "WorkerParts",
    "open_front",
    "open_queue",
    "queue_rules",
    "warn_of_clock_skew",
]

log = logging.getLogger("rlm_mcp.queue")

CLOCK_SKEW_WARN_S = 2.0


@dataclass(frozen=True)
class WorkerParts:
    """What a worker executes runs with, besides the queue: the contexts, the run records (their
    fenced logs: `run_log`, the same store seen by the queue's port), the kept sessions' sandboxes
    it holds between runs (built by the assembly, which made them the sandboxes' `reclaim`)."""

    contexts: ContextStorePort
    runs: RunStorePort
    run_log: FencedRunStore
    sessions: WorkerSessions | None = None


async def open_queue(
    stack: AsyncExitStack,
    settings: QueueSettings,
    queue: RunQueuePort,
    sandboxes: SandboxManager,
    engine: Callable[[], Awaitable[RLMEngine]],
    *,
    worker: WorkerParts | None,
    liveness: LeaseLiveness | None = None,
    ends: RunEnds | None = None,
    lane: LocalLane | None = None,
) -> RunManager | None:
    """Open the queue's parts that every team process runs on `stack`: the sweeper and the
    gauges always, the worker when `worker` is given (this process executes runs). Returns the
    worker's local `RunManager` (the runs it executes), None without one. `queue`: opened by the
    assembly, closed by its stack. `ends`: the run-end hook, told by whichever part's write ends
    a run. `lane`: the link between this process's worker and its front (`local.py`: `both`)."""
    await warn_of_clock_skew(queue)
    sweeper = Sweeper(settings, queue, sandboxes if worker is not None else None, liveness, ends=ends)
    tg = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(tg.cancel_scope.cancel)  # runs before the group exits (callbacks unwind in reverse)
    tg.start_soon(sweeper.run_forever)
    tg.start_soon(sample_forever, queue)  # the queue gauges of /metrics
    if worker is None:
        return None
    manager = await stack.enter_async_context(
        RunManager(settings.runs, worker.contexts, worker.runs, owners=configured_owners(settings.server), ends=ends)
    )
    executor = QueueWorker(
        settings, queue, worker.run_log, manager, sandboxes, engine, sessions=worker.sessions, ends=ends, lane=lane
    )
    await stack.enter_async_context(executor)
    return manager


async def open_front(
    stack: AsyncExitStack,
    settings: QueueSettings,
    queue: RunQueuePort,
    *,
    ends: RunEnds | None = None,
    lane: LocalLane | None = None,
) -> QueueFront:
    """A front's part of the queue on `stack`: enqueue runs and follow them (a front, or `both`;
    a worker-only process answers no MCP client and opens none). `lane`: `both`'s link to this
    process's worker (`local.py`)."""
    return await stack.enter_async_context(QueueFront(settings, queue, Wakeups(queue), ends=ends, lane=lane))


async def warn_of_clock_skew(queue: RunQueuePort) -> float | None:
    """Log a warning when this process's clock and the database's differ by more than
    CLOCK_SKEW_WARN_S: every time replicas compare is the database's, but this process's own
    times (run created_at, log event times) would mislead. Returns the skew (None: unknown)."""
    try:
        skew = await queue.clock_skew_s()
    except Exception as exc:  # the database is restarting: the queue's own calls will say so
        log.info("could not compare this clock with the database's: %s", exc)
        return None
    if abs(skew) > CLOCK_SKEW_WARN_S:
        log.warning(
            "this host's clock is %.1f s %s the database's; fix its time sync (NTP, chrony): run times it "
            "shows will be off (leases and timeouts use the database's clock)",
            abs(skew),
            "ahead of" if skew > 0 else "behind",
        )
    return skew
