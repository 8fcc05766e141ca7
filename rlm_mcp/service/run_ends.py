"""The run-end hook's registry: the work hung on every run's end, told once per run end.

Every way a run ends passes through `RunEnds.ended`, exactly once, after the run's final record
is written: in embedded mode the local `RunManager` (service/runs.py) tells it for each run it
started; in team mode the queue's conditional end writes do (`service.queue.ends.EndReporting`:
a worker's final record or its not-started end, a front's cancel of a queued run, a sweeper's
end of a lost worker's run or of one no worker took), so the writer whose write ended the run
is the one that tells. The assembly builds one registry per process and subscribes the hooks.

Subscribers are awaited in turn (embedded mode: before the run's waiters wake), so one whose work
is slow (a webhook) hands it to a task of its own rather than holding up the run's end.

A run whose first record the store refused was never accepted: it has no end to tell, but its
first LM request may already have gone out beside that record (service/late_start.py), so what it
left outside the process (a router's session) is released through `withdrawn`, which only the
subscribers of `subscribe_withdrawn` hear.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import anyio

from rlm_mcp.ports.runs import RunEnded, RunEndHook, RunRecord

logger = logging.getLogger("rlm_mcp.service")


class RunEnds:
    """The subscribers of the run-end hook, told in the order they subscribed."""

    def __init__(self, hooks: Iterable[RunEndHook] = ()) -> None:
        self._hooks: list[RunEndHook] = list(hooks)
        self._withdrawn: list[Callable[[str], Awaitable[object]]] = []

    def subscribe(self, hook: RunEndHook) -> None:
        self._hooks.append(hook)

    def subscribe_withdrawn(self, hook: Callable[[str], Awaitable[object]]) -> None:
        """Also tell `hook` the id of every run withdrawn before it was accepted."""
        self._withdrawn.append(hook)

    @property
    def listened(self) -> bool:
        """Whether any hook is subscribed (a team end that must read its record first skips
        the read when none is)."""
        return bool(self._hooks)

    async def ended(self, record: RunRecord) -> None:
        """Tell every subscriber that the run of `record` (its final record, written) ended.
        Shielded: a run ended by a cancellation is still told; a subscriber that fails is logged
        and the others are told all the same."""
        if not self._hooks:
            return
        told = RunEnded.of(record)
        with anyio.CancelScope(shield=True):
            for hook in list(self._hooks):
                try:
                    await hook(told)
                except Exception:
                    logger.exception("a run-end hook failed for run %s", record.run_id)

    async def withdrawn(self, run_id: str) -> None:
        """Tell the withdrawal subscribers that run `run_id` was withdrawn (its first record was
        refused, so it never was a run: no end is told). Shielded; failures are logged."""
        with anyio.CancelScope(shield=True):
            for hook in list(self._withdrawn):
                try:
                    await hook(run_id)
                except Exception:
                    logger.exception("a run-withdrawal hook failed for run %s", run_id)
