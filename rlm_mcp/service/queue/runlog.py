"""A worker's run log: the fenced log (PostgreSQL's in team mode), written in batches, and the run's `lm_called` mark.

Events are staged and written by flushes (`PgRunLog.flush`; the process's log writer,
`store.pg.log_writer`, puts the flushes of its runs pending at once in one statement, each with
its own fence and answer), at these moments:
- the first answered LM call (`LLMCall` without an error): its row and the `lm_called` mark are
  written, and awaited, before the engine goes on to run the reply's code, so "no LM reply
  recorded" (the only runs the sweepers queue again after their worker is lost) holds with no
  delay in between; a run whose first answer cannot be recorded stops (`must_stop`) before it
  runs any code, as a sweeper could otherwise queue it again while it goes on;
- each live summary the worker publishes (`publish`: the staged events, the summary and, for a
  run a front follows turn by turn or the run's first one, the wake-up together, on a progress
  event, at most every RLM_MCP_LIVE_SUMMARY_INTERVAL_S: the
  latest state after a burst), and every RLM_MCP_QUEUE_POLL_S while events are staged
  (`publishing.publish_until_done`);
- the final summary (`write_summary`: the staged events and the final record in one statement,
  the queue's one conditional end write, fenced by the attempt: `FencedRunLog.finish`, after
  which the run-end hook is told), `aclose`, and the worker's own final write (which, after a
  failed statement, writes the events and then the record through the queue's `finish`).

What a SIGKILL of the worker loses: the events staged since the last flush, at most one poll
interval's worth (or one live-summary interval's, if that is set longer), and the live summary's
changes of that time (the sweeper ends such a run anyway). Never a final record, nor a write
past the fence: every flush is the fenced statement, coalesced or not. No sweeper rule reads them: a run's requeue depends only on an answered LM call
being recorded, and the first one is always written before the run goes on (later ones wait for
the next flush, as the rule is already settled by then). The order (by sequence) is kept: rows
take their sequence when staged and are written in that order, one flush at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from rlm_mcp.call_lines import CallLine
from rlm_mcp.events import LLMCall, RunEvent
from rlm_mcp.ports.queue import FencedRunLog
from rlm_mcp.ports.runs import RunRecord

log = logging.getLogger("rlm_mcp.queue")


class QueueRunLog:
    """`store.ports.RunLogPort` over a fenced log (`ports.queue.FencedRunLog`: PostgreSQL's
    `PgRunLog` in team mode), staging events between flushes."""

    def __init__(
        self,
        inner: FencedRunLog,
        *,
        hand_back: Callable[[], bool] | None = None,
        finish: Callable[[RunRecord], Awaitable[bool]] | None = None,
        announced: Callable[[RunRecord], None] | None = None,
    ) -> None:
        """`hand_back`: asked before the final summary is written; True: the run goes back to
        the queue instead (the log detaches and writes no summary). `finish`: how the final
        summary is written with the events still staged (the queue's fenced end write, in one
        statement with them: `FencedRunLog.finish`; None: with the events, by the log).
        `announced`: told of each record an announcement of this log carried, once its write
        committed (a live summary, or the final record when `finish` ended the run): the local
        lane's front (`local.LocalLane`)."""
        self._inner = inner
        self._finish = finish
        self._announced = announced
        self._marked = False
        self._hand_back = hand_back
        self.final_written = False  # the final summary (or another process's) is in the record
        # Why the run must stop here: its first answered LM call could not be recorded, or a
        # write matched nothing (the run ended elsewhere or is another attempt's now).
        self.must_stop: str | None = None
        self.unrecorded = False  # the first answered LM call could not be recorded

    @property
    def lm_called(self) -> bool:
        """Whether the `lm_called` mark is written: the one answer to "may this run go back to the
        queue" that this worker and the sweepers share (a failed call, even one with usage, is
        not an answered one)."""
        return self._marked

    @property
    def run_id(self) -> str:
        return self._inner.run_id

    @property
    def staged(self) -> int:
        return self._inner.staged

    async def open(self) -> None:
        await self._inner.open()

    async def append(self, event: RunEvent) -> None:
        self._inner.stage(event)
        if not self._marked and isinstance(event, LLMCall) and event.error is None:  # an answered call
            await self._mark_lm_called()

    async def append_call(self, call: CallLine) -> None:
        self._inner.stage_call(call)
        if not self._marked and call.answered:
            await self._mark_lm_called()

    async def _mark_lm_called(self) -> None:
        """The first answered LM call: its row and the `lm_called` mark, written now."""
        try:
            if not await self._inner.flush(mark_lm_called=True):
                self.must_stop = "the run is no longer this worker's"
            self._marked = True
        except Exception as exc:  # the database is away, or refused the row: no code may run unrecorded
            log.warning("could not record run %s's first LM reply; stopping it: %s", self.run_id, exc)
            self.unrecorded = True

    async def publish(self, summary: RunRecord, *, announce: bool = True) -> bool:
        """The staged events, the live summary and (`announce`) the wake-up in one statement;
        False when the run had already ended elsewhere (a sweeper declared its worker lost): the
        summary is not written then. Not announced, the summary is in the row only, for those
        who read it (`publishing.publish_until_done` says which are). The `lm_called` mark is not
        this statement's: the first answered call wrote it already (`append`)."""
        if summary.done and self._finish is not None:
            # The final record is written once, by `write_summary` through the queue's end write
            # (which tells the run-end hook): a report that sees the result first leaves it there.
            return True
        live = await self._inner.flush(summary=summary, announce=announce)
        if not live:
            self.must_stop = self.must_stop or "the run is no longer this worker's"
        elif announce and self._announced is not None:
            self._announced(summary)
        return live

    async def flush(self) -> None:
        await self._inner.flush()

    async def write_summary(self, summary: RunRecord) -> None:
        """The staged events and the summary, announced (a worker's final summary through its
        end write, whose wake-up carries the record when it fits, else the run id alone: the
        followers read the row)."""
        if summary.done and self._hand_back is not None and self._hand_back():
            self.detach()
        if self._inner.detached:  # handed back to the queue: the requeue announces it
            await self._inner.flush()
            return
        if summary.done and self._finish is not None:
            # The events and the end together (the events land only while the run is this
            # attempt's): `finish` writes both in one statement.
            ended = await self._finish(summary)
            self.final_written = True  # written now, or the run had ended elsewhere already
            if ended and self._announced is not None:
                self._announced(summary)
            return
        await self._inner.flush(summary=summary, announce=True)
        if summary.done:
            self.final_written = True  # written now, or the run had ended elsewhere already

    async def aclose(self) -> None:
        await self._inner.aclose()

    def detach(self) -> None:
        self._inner.detach()
