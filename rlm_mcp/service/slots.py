"""The run slots of one process, shared fairly between owners.

`SlotGate` holds RLM_MCP_MAX_RUNS slots. A run takes one when one is free and its owner holds
fewer than its share (`run_queue.owner_run_share`); otherwise it waits, in arrival order, and
the oldest waiting run that may take a freed slot takes it. A run over its owner's share waits
even while slots are free (it never takes a slot another owner's run could use), and it never
blocks the runs queued behind it: those of other owners go first.

Every change happens between awaits, so the counts are exact under concurrent runs; a waiter
cancelled (or leaving) after it was handed a slot gives it back.
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

    def line_up(self, owner: str, holder: Holder, *, shared: bool = True) -> Place:
        """Take `holder`'s place in the line now (a free slot at once, if one may be taken), to be
        waited on later (`Place.wait`, which the caller bounds with a cancel scope) or left
        (`Place.leave`); `holder.slotted` turns True as it gets the slot. A run takes its place
        when it is started, before the awaits that come ahead of its wait (its record, its
        pins), so runs are served in the order they were started. `shared=False`: the owner's
        share was applied already (a team worker claims runs within it) and is not applied
        again; the run still counts towards it."""
        waiter = _Waiter(owner, holder, shared)
        if self._may_take(owner, shared):  # waiters left are all over their share, or no slot is free
            self._take(owner, holder)
            waiter.granted = True
        else:
            self._waiters.append(waiter)
        return Place(self, waiter)

    def _leave(self, waiter: _Waiter) -> None:
        if waiter.granted:  # it holds a slot it will not use: pass it on
            waiter.holder.slotted = False
            self.release(waiter.owner)
        else:
            self._waiters.remove(waiter)

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


class Place:
    """A run's place in `SlotGate`'s line (`line_up`): waited on once, or left before that. A
    place granted at once, or while nobody waited on it, holds its slot from that moment; once
    `wait` returned, the slot is the caller's to release (`SlotGate.release`)."""

    def __init__(self, gate: SlotGate, waiter: _Waiter) -> None:
        self._gate = gate
        self._waiter = waiter
        self._settled = False  # waited on (the slot is the caller's) or left

    async def wait(self) -> None:
        """Until the slot is this run's; cancelled, the place is left (a slot handed over as it
        was cancelled is passed on)."""
        if not self._waiter.granted and not self._settled:
            try:
                await self._waiter.event.wait()
            except BaseException:
                self.leave()
                raise
        self._settled = True

    def leave(self) -> None:
        """Give the place up before it was waited on (the run ends first): out of the line, or
        its slot passed on (taken at once, or granted meanwhile). After `wait`: nothing."""
        if not self._settled:
            self._settled = True
            self._gate._leave(self._waiter)
