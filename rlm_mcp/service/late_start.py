"""A run's start steps that go beside its first LM call instead of before it: the record's
creation (`LateRecord`) and the contexts' pins (`LatePin`).

An embedded run that takes its slot at once sends its first request with what the call's
admission read, and does these two where the engine's `ready` step lets it: in the sandbox's
opening, which starts once that request is on its way (engine/opening.py). Both were on the
path of every run's first request (a file write and a SQLite write in a worker thread). What a
caller sees does not move: `RunManager.start` returns only once the record exists, so the run id
it hands out always names a stored record, and a run that fails before its first request still
creates its record before it writes its end (`service/runs.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack

import anyio

from rlm_mcp.call_lines import CallLine
from rlm_mcp.engine import RunNotStarted
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import RunEvent
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store import ContextInfo
from rlm_mcp.store.ports import RunLogPort, RunStorePort

__all__ = ["LatePin", "LateRecord"]

logger = logging.getLogger("rlm_mcp.service")


class LatePin:
    """A run's contexts, pinned beside its first LM call: by the sandbox's opening (the engine's
    `ready`, awaited before the sandbox loads them), not before the run's first request (their
    SQLite write was on its path). The outcome is kept: `check` gives the caller the pin's failure
    as the run's, even when the run ended without opening its sandbox, so a context gone since
    the call was admitted fails the call (`RunNotStarted`) as it did when the pin came first."""

    def __init__(
        self, pins: AsyncExitStack, enter: Callable[[], AbstractAsyncContextManager[list[ContextInfo]]]
    ) -> None:
        self._pins = pins
        self._enter = enter
        self._lock = anyio.Lock()
        self._done = False
        self._error: Exception | None = None

    async def get(self) -> None:
        """Pin (once: the pins go onto `pins`, released by the run's task); the pin's error."""
        async with self._lock:
            if not self._done:
                try:
                    await self._pins.enter_async_context(self._enter())
                except Exception as exc:
                    self._error = exc
                self._done = True  # not when cancelled midway: a later call pins again
        if self._error is not None:
            raise self._error

    async def check(self) -> None:
        """`get`, its refusal raised as the run's not having started (as a pin before the run)."""
        if self._done and self._error is None:
            return  # pinned: no lock round on the run's way to its answer
        try:
            await self.get()
        except RlmMcpError as exc:
            raise RunNotStarted(exc) from exc


class LateRecord:
    """A new run's record, created once by whichever step comes first: the run's `ready` step
    (beside its first LM call), the run's task before it waits for a slot or writes its end, or
    `RunManager.start` when the run has reached none of those soon. Until then the run's events
    wait here, in order (`log`), and go to its log once the record exists."""

    def __init__(self, records: RunStorePort, record: RunRecord) -> None:
        self._records = records
        self._record = record  # as the run was when it was accepted (queued): the stored first version
        self._lock = anyio.Lock(fast_acquire=True)
        self.settled = anyio.Event()  # created, or failed
        self._log: RunLogPort | None = None
        self._error: Exception | None = None
        self.log = _EarlyLog(self, record.run_id)

    async def create(self) -> RunLogPort:
        """Create the record (once), then write the events that waited for it; the store's error
        when it refused. Shielded: a record half made would be neither there nor gone."""
        with anyio.CancelScope(shield=True):
            async with self._lock:
                if not self.settled.is_set():
                    try:
                        self._log = await self._records.create(self._record)
                        await self.log.attach(self._log)
                    except Exception as exc:
                        self._error = exc
                    finally:
                        self.settled.set()
        if self._error is not None:
            raise self._error
        assert self._log is not None
        return self._log


class _EarlyLog:
    """The run's log as its task writes it: the store's log once the record exists; before,
    the events in memory, in order (nothing reads a run's log before its record exists)."""

    def __init__(self, record: LateRecord, run_id: str) -> None:
        self._record = record
        self._run_id = run_id
        self._log: RunLogPort | None = None
        self._opened = False
        self._waiting: list[RunEvent | CallLine] = []

    @property
    def run_id(self) -> str:
        return self._run_id

    async def attach(self, log: RunLogPort) -> None:
        """The record exists: the events so far go to its log (a failed write is the run's log's
        problem, as for any append: logged, the run goes on)."""
        try:
            if self._opened:
                await log.open()
            for event in self._waiting:
                if isinstance(event, CallLine):
                    await log.append_call(event)
                else:
                    await log.append(event)
        except Exception:
            logger.exception("could not write the first events of run %s", self.run_id)
        self._waiting.clear()
        self._log = log

    async def open(self) -> None:
        if self._log is not None:
            await self._log.open()
        else:
            self._opened = True

    async def append(self, event: RunEvent) -> None:
        if self._log is not None:
            await self._log.append(event)
        else:
            self._waiting.append(event)

    async def append_call(self, call: CallLine) -> None:
        if self._log is not None:
            await self._log.append_call(call)
        else:
            self._waiting.append(call)

    async def write_summary(self, record: RunRecord) -> None:
        await (await self._record.create()).write_summary(record)

    async def aclose(self) -> None:
        if self._log is not None:
            await self._log.aclose()
