"""What the queue derives from a run's record: its sandbox need, and its final record when it
could not start; and `EndReporting`, where team mode tells the run-end hook."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import NotStarted, RunRecord, RunRequest
from rlm_mcp.service.run_ends import RunEnds

log = logging.getLogger("rlm_mcp.queue")


def need_of(request: RunRequest) -> int:
    """Sandbox slots a run may hold at once: one per depth of its tree (`sandbox/slots.py`); a
    worker with fewer slots in all claims it when all of its slots are free."""
    return max(1, request.limits.max_depth)


def not_started(summary: RunRecord, cause: RlmMcpError) -> RunRecord:
    """The final record of a claimed run that could not start (its kept session ended): its
    waiting `rlm_complete` raises `cause` as a tool error."""
    record = summary.ended("error", str(cause))
    return record.model_copy(update={"not_started": NotStarted(cause=cause.cause, fix=cause.fix)})


class EndReporting:
    """The queue port, telling the run-end hook (`service.run_ends`) of every run end that its
    writes make. Each end is one conditional write that only one process's call wins (a worker's
    final record, fenced by its attempt; a front's cancel of a run still queued; a sweeper's end
    of a lost worker's run or of a run no worker took), so the hook is told exactly once per run
    end, by the process whose write ended it, after that write committed. Every other call goes
    to the queue unchanged."""

    def __init__(self, inner: RunQueuePort, ends: RunEnds) -> None:
        self._inner = inner
        self._ends = ends

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def finish(self, run_id: str, summary: RunRecord, *, attempt: int | None = None) -> bool:
        done = await self._inner.finish(run_id, summary, attempt=attempt)
        if done:
            await self._ends.ended(summary)
        return done

    async def finish_by(self, write: Callable[[], Awaitable[bool]], summary: RunRecord) -> bool:
        """`finish`, written by `write` (a worker's run log ends its run with its last events in
        one statement: `FencedRunLog.finish`); the hook is told as `finish` tells it."""
        done = await write()
        if done:
            await self._ends.ended(summary)
        return done

    async def cancel(self, run_id: str, summary_if_queued: RunRecord) -> bool:
        ended = await self._inner.cancel(run_id, summary_if_queued)
        if ended:
            await self._ends.ended(summary_if_queued)
        return ended

    async def end_or_requeue_lost(self, run_id: str) -> str | None:
        outcome = await self._inner.end_or_requeue_lost(run_id)
        if outcome == "ended":
            await self._tell_stored(run_id)
        return outcome

    async def time_out(self, run_id: str, reason: str) -> bool:
        ended = await self._inner.time_out(run_id, reason)
        if ended:
            await self._tell_stored(run_id)
        return ended

    async def _tell_stored(self, run_id: str) -> None:
        """Tell the end of a run the queue ended from its stored record (the sweeps write the
        final record from the row inside their own transaction): read once it committed."""
        if not self._ends.listened:
            return
        try:
            row = await self._inner.read(run_id)
        except Exception as exc:  # the database went away just after the end: logged, not retried
            log.warning("could not read run %s to tell its end: %s", run_id, exc)
            return
        if row is not None and row.done:
            await self._ends.ended(row.summary)
