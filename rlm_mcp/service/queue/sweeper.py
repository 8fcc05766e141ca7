"""Leases: what happens to runs whose worker was lost, and to runs no worker takes.

Every team-mode process sweeps; every write a sweep makes is conditional (`store.pg.queue.PgRunQueue`: a
row locked with SKIP LOCKED and its condition checked again), so concurrent sweepers act once.
Each run is handled in its own transaction, and a failure on one run is logged and the sweep goes
on with the next: no run can stall the sweeps.

- A run whose worker's heartbeat (the database's `now()`) is older than RLM_MCP_WORKER_LEASE_S,
  or whose worker said it is gone, ends `error` with a reason naming the lost worker (host, pid)
  and what to do. Exception: a run with no answered LM call (`rlm_runs.lm_called`, written before
  the run goes on to run code) that was never queued again is queued again, once.
- Outage-tolerant: a worker is judged lost only by a sweeper that has itself reached the database
  for a full lease without a failure, and only when the database itself has been up that long
  (`pg_postmaster_start_time`). After an outage every worker's heartbeat is old; its workers get
  a full lease to heartbeat again before any is declared lost.
- A run still queued after RLM_MCP_RUN_QUEUE_TIMEOUT_S (by the database's clock) ends `error`,
  saying whether any worker is alive.
- Processes with a sandbox backend (workers) also remove the sandboxes of lost workers on their
  Docker host, by owner label, never a live worker's, and keep `LeaseLiveness` current.

When: not every poll interval, but when a lease can next end. Each sweep reads the oldest
heartbeat of the workers still within their lease (a lease can only move later) and the next
sweep comes just after that lease ends (never sooner than one poll interval from now), or
sooner: at most every HOUSEKEEPING_EVERY poll intervals (the slower rules) and never later than
one lease. So the runs of a dead worker end within RLM_MCP_WORKER_LEASE_S plus one poll interval
of its last heartbeat, and an idle team sweeps every few seconds instead of every poll interval.
A round's reads (that plan, the lost workers' runs, the workers within and past their lease) are
one statement (`sweep_look`): a round with nothing to act on is one round trip.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.ports.queue import LostWorker, RunQueuePort
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.ends import EndReporting
from rlm_mcp.service.queue.liveness import LeaseLiveness
from rlm_mcp.service.run_ends import RunEnds

log = logging.getLogger("rlm_mcp.queue")

# Lost workers are looked for every round; queue timeouts and old rows once every
# HOUSEKEEPING_EVERY poll intervals, at most: their deadlines are longer.
HOUSEKEEPING_EVERY = 5
LEASE_SLACK_S = 0.05  # after a lease's end, so that the sweep finds it ended


class Sweeper:
    def __init__(
        self,
        settings: QueueSettings,
        queue: RunQueuePort,
        sandboxes: SandboxManager | None = None,
        liveness: LeaseLiveness | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        ends: RunEnds | None = None,
    ) -> None:
        """`ends`: the run-end hook, told of each run this sweeper ends (a lost worker's, or one
        no worker took in time)."""
        self._settings = settings
        self._queue: RunQueuePort = EndReporting(queue, ends if ends is not None else RunEnds())
        self._sandboxes = sandboxes
        self._liveness = liveness
        self._clock = clock
        self._housekept_at = float("-inf")
        self._connected_since: float | None = None  # since when every round reached the database

    async def run_forever(self) -> None:
        delay = self._settings.queue_poll_s
        while True:
            await anyio.sleep(delay)
            try:
                delay = await self.sweep_once()
            except Exception as exc:  # PostgreSQL restarting, Docker away: next round
                log.info("queue sweep failed: %s", exc)
                self._connected_since = None
                delay = self._settings.queue_poll_s

    async def sweep_once(self) -> float:
        """One round; the seconds until the next one is due (see the module's docstring)."""
        poll, lease = self._settings.queue_poll_s, self._settings.worker_lease_s
        started = self._clock()
        try:
            look = await self._queue.sweep_look()  # the plan, lost runs and workers: one round trip
        except Exception:
            self._connected_since = None
            raise
        oldest_s, up_s = look.oldest_s, look.up_s
        if self._connected_since is None:
            self._connected_since = started
        # Since when leases can be judged: this sweeper's last failure, or the database's start
        # (a restart that this sweeper's pool bridged without a failed round).
        connected_for = min(self._clock() - self._connected_since, up_s)
        judges = connected_for >= lease
        if judges:
            await self._lost_runs(look.lost_runs)
        now = self._clock()
        if now - self._housekept_at >= HOUSEKEEPING_EVERY * poll:  # the slower rules
            self._housekept_at = now
            await self._queue_timeouts()
            await self._queue.forget_old_workers()
        if self._sandboxes is not None or self._liveness is not None:
            await self._lost_sandboxes(judges, look.lost_workers, set(look.live_owners))
        due = min(HOUSEKEEPING_EVERY * poll, lease)
        if not judges:  # just after this sweeper has been connected for a full lease
            due = min(due, lease - connected_for + LEASE_SLACK_S)
        elif oldest_s is not None:  # just after the first lease that can end
            due = min(due, oldest_s + lease + LEASE_SLACK_S)
        return max(poll, due)

    async def _lost_runs(self, lost: list[str]) -> None:
        for run_id in lost:
            try:
                await self._queue.end_or_requeue_lost(run_id)
            except Exception as exc:  # this run only: the others are still handled
                log.warning("could not end or queue again run %s of a lost worker: %s", run_id, exc)

    async def _queue_timeouts(self) -> None:
        stale = await self._queue.stale_queued()
        if not stale:
            return
        timeout = self._settings.run_queue_timeout_s
        alive = await self._queue.live_workers()
        why = (
            "no worker is alive (start one: rlm-mcp serve --role worker, or --role both), then start the run again"
            if alive == 0
            else f"{alive} live worker(s) were all busy; try again later, or add workers or raise RLM_MCP_MAX_RUNS"
        )
        reason = f"No worker took the run within {timeout:.0f} s (RLM_MCP_RUN_QUEUE_TIMEOUT_S): {why}."
        for run_id in stale:
            try:
                await self._queue.time_out(run_id, reason)
            except Exception as exc:  # this run only
                log.warning("could not time out queued run %s: %s", run_id, exc)

    async def _lost_sandboxes(self, judges: bool, lost: list[LostWorker], live: set[str]) -> None:
        if self._sandboxes is not None:
            live |= {self._sandboxes.owner_id}
        lost = [w for w in lost if w.owner_id not in live] if judges else []
        if self._liveness is not None:
            self._liveness.live = frozenset(live)
            self._liveness.lost = frozenset(w.owner_id for w in lost)
        if self._sandboxes is None:
            return
        here = socket.gethostname()
        for w in lost:
            if w.host != here:
                continue  # its sandboxes are on its own host's container engine
            await self._sandboxes.ensure_ready()
            await self._sandboxes.backend.remove_owned(w.owner_id)
            await self._queue.mark_gone(w.worker_id)
            log.warning("removed the sandboxes of lost worker %s (owner %s)", w.worker_id, w.owner_id)
