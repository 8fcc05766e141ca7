"""The run slots of one process, shared fairly between owners.

`SlotGate` holds RLM_MCP_MAX_RUNS slots. A run takes one when one is free and its owner holds
fewer than its share (`run_queue.owner_run_share`); otherwise it waits, in arrival order, and
the oldest waiting run that may take a freed slot takes it. A run over its owner's share waits
even while slots are free (it never takes a slot another owner's run could use), and it never
blocks the runs queued behind it: those of other owners go first.

Every change happens between awaits, so the counts are exact under concurrent runs; a waiter
cancelled after it was handed a slot gives it back.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Protocol

import anyio


class Holder(Protocol):
    """What waits for a slot (a run): told the moment it is handed one."""

    slotted: bool


@dataclass(eq=False)
class _Waiter:
    owner: str
    holder: Holder
    shared: bool
    granted: bool = False
    event: anyio.Event = field(default_factory=anyio.Event)


class SlotGate:
    def __init__(self, slots: int, share: int) -> None:
        self.slots = slots
        self.share = share
        self._free = slots
        self._running: collections.Counter[str] = collections.Counter()
        self._waiters: collections.deque[_Waiter] = collections.deque()

    @property
    def free(self) -> int:
        """Slots no run holds."""
        return self._free

    def running(self, owner: str) -> int:
        """Slots `owner`'s runs hold."""
        return self._running[owner]

    def startable(self, owner: str) -> int:
        """How many more of `owner`'s runs could take a slot right now."""
        return max(0, min(self._free, self.share - self._running[owner]))

    def _may_take(self, owner: str, shared: bool = True) -> bool:
        return self._free > 0 and (not shared or self._running[owner] < self.share)

    def _take(self, owner: str, holder: Holder) -> None:
        self._free -= 1
        self._running[owner] += 1
        holder.slotted = True

    def try_acquire(self, owner: str, holder: Holder, *, shared: bool = True) -> bool:
        """Take a slot for `holder` if one is free for `owner` now (as `acquire` would at once)."""
        if not self._may_take(owner, shared):
            return False
        self._take(owner, holder)
        return True

    async def acquire(self, owner: str, holder: Holder, *, shared: bool = True) -> None:
        """Take a slot for `holder`, one of `owner`'s runs, waiting as long as it takes (the
        caller bounds the wait with a cancel scope); `holder.slotted` turns True as it gets it.
        `shared=False`: the owner's share was applied already (a team worker claims runs
        within it) and is not applied again; the run still counts towards it."""
        if self._may_take(owner, shared):  # waiters left are all over their share, or no slot is free
            self._take(owner, holder)
            return
        waiter = _Waiter(owner, holder, shared)
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:  # handed a slot as it was cancelled: pass it on
                holder.slotted = False
                self.release(owner)
            else:
                self._waiters.remove(waiter)
            raise

    def release(self, owner: str) -> None:
        """Give back a slot `owner`'s run held; the oldest waiter that may take it does."""
        self._free += 1
        self._running[owner] -= 1
        if self._running[owner] <= 0:
            del self._running[owner]
        for waiter in list(self._waiters):
            if not self._may_take(waiter.owner, waiter.shared):
                continue
            self._waiters.remove(waiter)
            self._take(waiter.owner, waiter.holder)
            waiter.granted = True
            waiter.event.set()
            if self._free == 0:
                break
