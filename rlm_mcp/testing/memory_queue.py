"""The run queue's port in memory (`ports.queue.RunQueuePort`), for the fast tier: the rules of
`store.pg.queue.PgRunQueue` (enqueue under the waiting bounds, fair claims by owner share and
sandbox need, attempt-fenced writes, leases and heartbeats, requeue once, the sweeps of lost
workers and of runs no worker takes) on dictionaries, judged on a clock the test moves.

`clock` is the database's clock of the PostgreSQL queue (wall seconds: heartbeats, leases,
queue timeouts); it starts the queue's "database" too (`sweep_look`'s uptime). Every method
runs without an await between its reads and its writes, so each is atomic, as one transaction
is. The queue is also the workers' `FencedRunStore`: `reopen` gives a run log whose flushes are
fenced by the claim's attempt, as `PgRunLog`'s are. Wake-ups are delivered at once to the
listeners of `listen_runs` and `listen_queue` (PostgreSQL's NOTIFY at commit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import anyio

from rlm_mcp.ports.queue import Beat, LostWorker, QueueRules, RunRow, RunState, SweepLook
from rlm_mcp.ports.runs import Notice, NoticeKind, RunPhase, RunRecord, WorkerRef, may_requeue
from rlm_mcp.testing.memory_queue_parts import FencedRunLogs, StoredRun, StoredWorker, choose_runs, listen

__all__ = ["MemoryRunQueue"]

FORGET_AFTER_S = 86400.0


class MemoryRunQueue(FencedRunLogs):
    """`RunQueuePort` and `FencedRunStore` in memory; `events` holds each run's logged lines as
    (attempt, seq, line)."""

    def __init__(self, rules: QueueRules, *, clock: Callable[[], float] = time.time) -> None:
        self._rules = rules
        self._clock = clock
        self.started_at = clock()  # the "database's" start (`sweep_look`)
        self._runs: dict[str, StoredRun] = {}
        self._workers: dict[int, StoredWorker] = {}
        self._next_worker = 1
        self.events: dict[str, list[tuple[int, int, str]]] = {}
        self._run_listeners: list[Callable[[str], None]] = []
        self._queue_listeners: list[Callable[[str], None]] = []

    # --- what a test does to the state (as SQL does to PostgreSQL's in the team tests) --------

    def silence(self, worker_id: int, *, for_s: float = 3600.0) -> None:
        """The worker's last heartbeat `for_s` ago (it stopped, or froze)."""
        self._workers[worker_id].heartbeat_at = self._clock() - for_s

    def age_queued(self, seconds: float) -> None:
        """Every queued run waited `seconds` longer."""
        for run in self._runs.values():
            if run.row.state is RunState.QUEUED:
                run.queued_at -= seconds

    def set_lm_called(self, run_id: str, value: bool) -> None:
        self._set(run_id, lm_called=value)

    # --- inside ---------------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock()

    def _set(self, run_id: str, **changes: object) -> None:
        run = self._runs[run_id]
        run.row = replace(run.row, **changes)  # type: ignore[arg-type]

    def _live(self, w: StoredWorker) -> bool:
        return w.gone_at is None and w.heartbeat_at > self._now() - self._rules.lease_s

    def _lost(self, worker_id: int | None) -> bool:
        w = self._workers.get(worker_id) if worker_id is not None else None
        return w is None or not self._live(w)

    def _notify_run(self, payload: str) -> None:
        for on_note in list(self._run_listeners):
            on_note(payload)

    def _notify_queue(self, payload: str) -> None:
        for on_note in list(self._queue_listeners):
            on_note(payload)

    def _queued(self) -> list[StoredRun]:
        return [r for r in self._runs.values() if r.row.state is RunState.QUEUED]

    def _requeue(self, run_id: str, summary: RunRecord, attempt: int) -> bool:
        run = self._runs.get(run_id)
        if run is None or run.row.state is not RunState.RUNNING or run.row.attempt != attempt:
            return False
        self._set(run_id, state=RunState.QUEUED, worker_id=None, requeues=run.row.requeues + 1, summary=summary)
        run.queued_at = self._now()
        self._notify_run(run_id)
        self._notify_queue("queued")
        return True

    def _finish(self, run_id: str, summary: RunRecord, attempt: int | None) -> bool:
        run = self._runs.get(run_id)
        if run is None:
            return False
        if attempt is None and run.row.state is RunState.DONE:
            return False
        if attempt is not None and (run.row.state is not RunState.RUNNING or run.row.attempt != attempt):
            return False
        self._set(run_id, state=RunState.DONE, summary=summary)
        self._notify_run(run_id)
        return True

    def _ref(self, worker_id: int | None) -> WorkerRef:
        if worker_id is None:
            return WorkerRef()
        w = self._workers.get(worker_id)
        return WorkerRef(worker_id=worker_id) if w is None else WorkerRef(worker_id=worker_id, host=w.host, pid=w.pid)

    # --- fronts ---------------------------------------------------------------------------

    async def enqueue(
        self,
        record: RunRecord,
        need: int,
        *,
        prefer_worker: int | None = None,
        prefer_s: float = 0.0,
        wake_workers: bool = True,
    ) -> None:
        await anyio.lowlevel.checkpoint()
        owner = str(record.request.owner)
        queued = self._queued()
        total, mine = len(queued), sum(1 for r in queued if r.row.owner == owner)
        if total >= self._rules.max_queued or mine >= self._rules.max_queued_per_owner:
            busy = self._rules.refusal(total, mine)
            assert busy is not None
            raise busy
        now = self._now()
        row = RunRow(
            run_id=record.run_id,
            owner=owner,
            state=RunState.QUEUED,
            attempt=0,
            summary=record,
            worker_id=None,
            lm_called=False,
            requeues=0,
            next_seq=0,
            log_bytes=0,
            created_at=record.created_at,
            cancel_requested=False,
        )
        self._runs[record.run_id] = StoredRun(
            row,
            max(1, need),
            now,
            prefer_worker,
            now + (prefer_s if prefer_worker is not None else 0.0),
        )
        if wake_workers:
            self._notify_queue("queued")

    async def wake_workers(self) -> None:
        await anyio.lowlevel.checkpoint()
        self._notify_queue("queued")

    async def read(self, run_id: str) -> RunRow | None:
        await anyio.lowlevel.checkpoint()
        run = self._runs.get(run_id)
        return run.row if run is not None else None

    async def cancel(self, run_id: str, summary_if_queued: RunRecord) -> bool:
        await anyio.lowlevel.checkpoint()
        run = self._runs.get(run_id)
        if run is not None and run.row.state is RunState.QUEUED:
            self._set(run_id, state=RunState.DONE, summary=summary_if_queued)
            self._notify_run(run_id)
            return True
        self._notify_run(run_id)
        if run is not None and run.row.state is RunState.RUNNING:
            self._set(run_id, cancel_requested=True)
            self._notify_queue(f"cancel {run_id}")
        return False

    async def queued_counts(self, owner: str) -> tuple[int, int]:
        await anyio.lowlevel.checkpoint()
        queued = self._queued()
        return len(queued), sum(1 for r in queued if r.row.owner == owner)

    async def live_workers(self) -> int:
        await anyio.lowlevel.checkpoint()
        return sum(1 for w in self._workers.values() if self._live(w))

    async def gauges(self) -> tuple[int, float, int]:
        queued = self._queued()
        oldest = max((self._now() - r.queued_at for r in queued), default=0.0)
        return len(queued), max(0.0, oldest), await self.live_workers()

    # --- workers --------------------------------------------------------------------------

    async def register_worker(self, owner_id: str, slots: int) -> int:
        await anyio.lowlevel.checkpoint()
        now = self._now()
        for w in self._workers.values():
            if w.owner_id == owner_id and w.gone_at is None:
                w.gone_at = now
        worker_id, self._next_worker = self._next_worker, self._next_worker + 1
        self._workers[worker_id] = StoredWorker(owner_id, slots, now)
        self._notify_queue("queued")
        return worker_id

    async def unregister_worker(self, worker_id: int) -> None:
        await self.mark_gone(worker_id)

    async def heartbeat(self, worker_id: int) -> Beat:
        await anyio.lowlevel.checkpoint()
        w = self._workers.get(worker_id)
        registered = w is not None and w.gone_at is None
        if w is not None and registered:
            w.heartbeat_at = self._now()
        held = {
            r.row.run_id: (r.row.attempt, r.row.cancel_requested)
            for r in self._runs.values()
            if r.row.state is RunState.RUNNING and r.row.worker_id == worker_id
        }
        return Beat(registered, held)

    async def any_queued(self) -> bool:
        await anyio.lowlevel.checkpoint()
        return any(True for _ in self._queued())

    async def claim(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, sessions: bool = True
    ) -> RunRow | None:
        rows = await self.claim_many(worker_id, free_sandboxes, max_sandboxes, limit=1, sessions=sessions)
        return rows[0] if rows else None

    async def claim_many(
        self, worker_id: int, free_sandboxes: int, max_sandboxes: int, *, limit: int, sessions: bool = True
    ) -> list[RunRow]:
        await anyio.lowlevel.checkpoint()
        now = self._now()
        live = [w for w in self._workers.values() if self._live(w)]
        share = self._rules.share(max(1, sum(w.slots for w in live)))
        busy: dict[str, int] = {}
        for r in self._runs.values():
            if r.row.state is RunState.RUNNING:
                busy[r.row.owner] = busy.get(r.row.owner, 0) + 1

        def prefers_another(r: StoredRun) -> bool:
            if r.prefer_worker is None or r.prefer_worker == worker_id or r.prefer_until <= now:
                return False
            w = self._workers.get(r.prefer_worker)
            return w is not None and self._live(w)

        picks = choose_runs(
            self._queued(),
            busy,
            share,
            free_sandboxes,
            max_sandboxes,
            limit=max(1, limit),
            workers=max(1, len(live)),
            sessions=sessions,
            prefers_another=prefers_another,
            prefers_this=lambda r: r.prefer_worker == worker_id,
        )
        for pick in picks:
            self._set(
                pick.row.run_id,
                state=RunState.RUNNING,
                attempt=pick.row.attempt + 1,
                worker_id=worker_id,
                cancel_requested=False,
            )
        return [pick.row for pick in picks]

    async def cancels(self, worker_id: int) -> list[str]:
        return await self._held_where(worker_id, "cancel_requested")

    async def followed(self, worker_id: int) -> list[str]:
        return await self._held_where(worker_id, "followed")

    async def _held_where(self, worker_id: int, flag: str) -> list[str]:
        """The ids of the worker's running runs whose row has `flag` set."""
        await anyio.lowlevel.checkpoint()
        return [
            r.row.run_id
            for r in self._runs.values()
            if r.row.state is RunState.RUNNING and r.row.worker_id == worker_id and getattr(r.row, flag)
        ]

    async def follow_progress(self, run_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        run = self._runs.get(run_id)
        if run is None or run.row.state is RunState.DONE or run.row.followed:
            return
        self._set(run_id, followed=True)
        if run.row.state is RunState.RUNNING:
            self._notify_queue(f"follow {run_id}")

    async def requeue(self, run_id: str, attempt: int, summary: RunRecord) -> bool:
        await anyio.lowlevel.checkpoint()
        return self._requeue(run_id, summary, attempt)

    async def finish(self, run_id: str, summary: RunRecord, *, attempt: int | None = None) -> bool:
        await anyio.lowlevel.checkpoint()
        return self._finish(run_id, summary, attempt)

    async def worker_ref(self, worker_id: int | None) -> WorkerRef:
        await anyio.lowlevel.checkpoint()
        return self._ref(worker_id)

    # --- sweepers -------------------------------------------------------------------------

    def _plan(self) -> tuple[float | None, float]:
        now = self._now()
        live = [w.heartbeat_at for w in self._workers.values() if self._live(w)]
        return (min(live) - now if live else None), now - self.started_at

    async def sweep_look(self) -> SweepLook:
        await anyio.lowlevel.checkpoint()  # then the three reads at one instant, as one statement's
        return SweepLook(*self._plan(), self._lost_runs(), *self._present())

    def _lost_runs(self) -> list[str]:
        return sorted(
            r.row.run_id
            for r in self._runs.values()
            if r.row.state is RunState.RUNNING and r.row.worker_id is not None and self._lost(r.row.worker_id)
        )

    async def end_or_requeue_lost(self, run_id: str) -> str | None:
        await anyio.lowlevel.checkpoint()
        run = self._runs.get(run_id)
        if run is None or run.row.state is not RunState.RUNNING or not self._lost(run.row.worker_id):
            return None
        row = run.row
        who = self._ref(row.worker_id)
        if may_requeue(lm_called=row.lm_called, requeues=row.requeues):
            notice = Notice(kind=NoticeKind.REQUEUED_WORKER_LOST, worker=who)
            summary = row.summary.model_copy(update={"status": "queued", "phase": RunPhase.QUEUED, "notice": notice})
            self._requeue(run_id, summary, row.attempt)
            return "requeued"
        lost = Notice(kind=NoticeKind.WORKER_LOST, worker=who, lease_s=self._rules.lease_s)
        self._finish(run_id, row.summary.ended("error", lost.render(), notice=lost), row.attempt)
        return "ended"

    def _stale(self, run: StoredRun) -> bool:
        return run.row.state is RunState.QUEUED and run.queued_at < self._now() - self._rules.queue_timeout_s

    async def stale_queued(self) -> list[str]:
        await anyio.lowlevel.checkpoint()
        return [r.row.run_id for r in sorted(self._runs.values(), key=lambda r: r.queued_at) if self._stale(r)]

    async def time_out(self, run_id: str, reason: str) -> bool:
        await anyio.lowlevel.checkpoint()
        run = self._runs.get(run_id)
        if run is None or not self._stale(run):
            return False
        return self._finish(run_id, run.row.summary.ended("error", reason), None)

    async def forget_old_workers(self) -> None:
        await anyio.lowlevel.checkpoint()
        now = self._now()
        holding = {r.row.worker_id for r in self._runs.values() if r.row.state is RunState.RUNNING}
        for worker_id, w in list(self._workers.items()):
            old = (w.gone_at is not None and w.gone_at < now - FORGET_AFTER_S) or w.heartbeat_at < now - FORGET_AFTER_S
            if old and worker_id not in holding:
                del self._workers[worker_id]

    def _present(self) -> tuple[list[LostWorker], set[str]]:
        present = [(i, w) for i, w in self._workers.items() if w.gone_at is None]
        live = {w.owner_id for _, w in present if self._live(w)}
        return [LostWorker(i, w.owner_id, w.host) for i, w in present if w.owner_id not in live], live

    async def mark_gone(self, worker_id: int) -> None:
        await anyio.lowlevel.checkpoint()
        w = self._workers.get(worker_id)
        if w is not None:
            w.gone_at = self._now()

    async def clock_skew_s(self) -> float:
        return 0.0  # one clock

    # --- wake-ups -------------------------------------------------------------------------

    async def listen_runs(self, on_note: Callable[[str], None], *, on_connect: Callable[[], object]) -> None:
        await listen(self._run_listeners, on_note, on_connect)

    async def listen_queue(
        self, on_note: Callable[[str], None], *, on_connect: Callable[[], object], on_disconnect: Callable[[], object]
    ) -> None:
        await listen(self._queue_listeners, on_note, on_connect, on_disconnect)

    async def follow_run(self, run_id: str) -> None:
        """Nothing to do: every listener hears every run here (one process, no wake-up to spare)."""

    def forget_run(self, run_id: str) -> None:
        """Nothing to do (`follow_run`)."""

    async def listener_alive(self, within_s: float) -> bool:
        """A listener here loses nothing while it is registered (`listen`)."""
        return bool(self._run_listeners)
