"""A worker's run log over the in-memory queue (`memory_queue.MemoryRunQueue.reopen`): events
staged with the next sequence and written by `flush` with the record, the `lm_called` mark and
the wake-up, all fenced by the claim's attempt, as `store.pg.run_log.PgRunLog` writes them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import anyio

from rlm_mcp.call_lines import CallLine
from rlm_mcp.events import RunEvent, to_json
from rlm_mcp.ports.queue import RunPins
from rlm_mcp.ports.runs import RunRecord

__all__ = ["End", "MemoryRunLog", "Write"]

# (staged (seq, line) rows, the next sequence, the record, mark lm_called, announce) -> still live
Write = Callable[[list[tuple[int, str]], int, RunRecord | None, bool, bool], bool]
End = Callable[[RunRecord], bool]  # the queue's fenced end write of the run -> this call ended it


class MemoryRunLog:
    """`ports.queue.FencedRunLog` over a `MemoryRunQueue`'s run: `write` is the queue's fenced
    write of this run under the claim's attempt."""

    def __init__(self, write: Write, run_id: str, seq: int, end: End) -> None:
        self._write = write
        self._end = end
        self._run_id = run_id
        self._seq = seq
        self._staged: list[tuple[int, str]] = []
        self._closed = False
        self._detached = False

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def staged(self) -> int:
        return len(self._staged)

    @property
    def detached(self) -> bool:
        return self._detached

    async def open(self) -> None:
        await anyio.lowlevel.checkpoint()

    def stage_call(self, call: CallLine) -> None:
        self.stage(call.event())

    def stage(self, event: RunEvent) -> None:
        if self._closed:
            return
        self._staged.append((self._seq, json.dumps(to_json(event, ts=time.time()))))
        self._seq += 1

    async def flush(
        self, *, summary: RunRecord | None = None, mark_lm_called: bool = False, announce: bool = False
    ) -> bool:
        await anyio.lowlevel.checkpoint()
        if self._detached:
            summary = None
        rows, self._staged = self._staged, []
        return self._write(rows, self._seq, summary, mark_lm_called, announce)

    async def finish(self, summary: RunRecord, *, pins: RunPins | None = None) -> bool:
        """The staged events and the end write, with nothing in between (one statement on
        PostgreSQL: `PgRunLog.finish`). `pins` are left to their holder: no pin is kept here."""
        await anyio.lowlevel.checkpoint()
        rows, self._staged = self._staged, []
        self._write(rows, self._seq, None, False, False)
        return self._end(summary)

    async def aclose(self) -> None:
        self._closed = True
        await self.flush()

    def detach(self) -> None:
        self._closed = True
        self._detached = True
