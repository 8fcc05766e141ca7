"""The memory queue's (`memory_queue.MemoryRunQueue`) parts: its rows, its claim's choice (the
rules of `store.pg.queue_statements.CLAIM` on a list), its listeners and its fenced run logs."""

from __future__ import annotations

import functools
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from rlm_mcp.ports.queue import RunRow, RunState
from rlm_mcp.ports.runs import RunRecord, encode_live
from rlm_mcp.testing.memory_runlog import MemoryRunLog

__all__ = ["FencedRunLogs", "StoredRun", "StoredWorker", "choose_runs", "listen"]


@dataclass
class StoredRun:
    row: RunRow
    need: int
    queued_at: float
    prefer_worker: int | None = None
    prefer_until: float = 0.0


@dataclass
class StoredWorker:
    owner_id: str
    slots: int
    heartbeat_at: float
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    gone_at: float | None = None


def choose_runs(
    queued: list[StoredRun],
    busy: dict[str, int],
    share: int,
    free_sandboxes: int,
    max_sandboxes: int,
    *,
    limit: int,
    workers: int,
    sessions: bool,
    prefers_another: Callable[[StoredRun], bool],
    prefers_this: Callable[[StoredRun], bool],
) -> list[StoredRun]:
    """Up to `limit` of the queued runs, as one claim after another would take them: of those
    whose sandbox need fits the free slots, each owner's runs preferring this worker first (no
    other may take them yet), then its oldest, with its count (`busy`:
    running runs by owner) grown by each of its runs picked before, the fewest first, up to its
    share; their needs summed against the free slots (stopping at the first that does not fit);
    at most the eligible runs' share of one of the `workers` live workers, rounded up."""
    fits = sorted(
        (
            r
            for r in queued
            if min(r.need, max_sandboxes) <= free_sandboxes
            and not prefers_another(r)
            and (sessions or r.row.summary.request.session_id is None)
        ),
        key=lambda r: (not prefers_this(r), r.queued_at, r.row.run_id),
    )
    counted: dict[str, int] = {}
    ranked: list[tuple[int, StoredRun]] = []
    for r in fits:
        nth = busy.get(r.row.owner, 0) + counted.get(r.row.owner, 0)
        counted[r.row.owner] = counted.get(r.row.owner, 0) + 1
        if nth < share:
            ranked.append((nth, r))
    ranked.sort(key=lambda nr: (nr[0], nr[1].queued_at, nr[1].row.run_id))
    bound = min(limit, -(-len(ranked) // workers))
    picks: list[StoredRun] = []
    needed = 0
    for _, r in ranked[:bound]:
        needed += min(r.need, max_sandboxes)
        if needed > free_sandboxes:
            break
        picks.append(r)
    return picks


async def listen(
    listeners: list[Callable[[str], None]],
    on_note: Callable[[str], None],
    on_connect: Callable[[], object],
    on_disconnect: Callable[[], object] | None = None,
) -> None:
    """Never disconnected here but by its end (a test cuts a listener by cancelling it)."""
    listeners.append(on_note)
    try:
        on_connect()
        await anyio.sleep_forever()
    finally:
        listeners.remove(on_note)
        if on_disconnect is not None:
            on_disconnect()


class FencedRunLogs(ABC):
    """The memory queue's side as the workers' `FencedRunStore`: run logs whose flushes are fenced
    by the claim's attempt, as `PgRunLog`'s are. The queue (`MemoryRunQueue`) owns the rows and
    gives the three writes below."""

    _runs: dict[str, StoredRun]
    events: dict[str, list[tuple[int, int, str]]]

    @abstractmethod
    def _set(self, run_id: str, **changes: object) -> None: ...

    @abstractmethod
    def _finish(self, run_id: str, summary: RunRecord, attempt: int | None) -> bool: ...

    @abstractmethod
    def _notify_run(self, payload: str) -> None: ...

    async def reopen(self, run_id: str, *, attempt: int | None = None) -> MemoryRunLog:
        await anyio.lowlevel.checkpoint()
        run = self._runs[run_id]
        end = functools.partial(self._end_logged, run_id, attempt)
        return MemoryRunLog(functools.partial(self._flush, run_id, attempt), run_id, run.row.next_seq, end)

    def reopen_claimed(self, row: RunRow) -> MemoryRunLog:
        end = functools.partial(self._end_logged, row.run_id, row.attempt)
        return MemoryRunLog(functools.partial(self._flush, row.run_id, row.attempt), row.run_id, row.next_seq, end)

    def _end_logged(self, run_id: str, attempt: int | None, summary: RunRecord) -> bool:
        return self._finish(run_id, summary, attempt)

    def _flush(
        self,
        run_id: str,
        attempt: int | None,
        lines: list[tuple[int, str]],
        seq: int,
        summary: RunRecord | None,
        mark_lm_called: bool,
        announce: bool,
    ) -> bool:
        run = self._runs.get(run_id)
        if run is None:
            return False
        if attempt is not None and (run.row.state is not RunState.RUNNING or run.row.attempt != attempt):
            return False
        log = self.events.setdefault(run_id, [])
        written = {(a, s) for a, s, _ in log}  # keyed as PostgreSQL's rows are: a retried flush adds none twice
        log.extend((attempt or 0, s, line) for s, line in lines if (attempt or 0, s) not in written)
        changes: dict[str, object] = {"next_seq": max(run.row.next_seq, seq)}
        if summary is not None and run.row.state is not RunState.DONE:
            changes["summary"] = summary
            if summary.done:
                changes["state"] = RunState.DONE
        if mark_lm_called:
            changes["lm_called"] = True
        live = run.row.state is not RunState.DONE
        self._set(run_id, **changes)
        if announce:
            still = self._runs[run_id].row.state is not RunState.DONE
            self._notify_run(encode_live(run_id, summary.live()) if still and summary is not None else run_id)
        return live and self._runs[run_id].row.state is not RunState.DONE
