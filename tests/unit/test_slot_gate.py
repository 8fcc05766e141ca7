"""`SlotGate`'s line: a run's place is taken when it lines up, before it waits, so slots go to
waiting runs in the order they lined up; a place left before its wait gives back what it holds."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest

from rlm_mcp.service.slots import SlotGate

pytestmark = pytest.mark.anyio


@dataclass
class Run:
    slotted: bool = False


async def test_waiting_runs_take_freed_slots_in_the_order_they_lined_up() -> None:
    gate = SlotGate(1, share=1)
    holder, second, third = Run(), Run(), Run()
    assert gate.try_acquire("a", holder)
    places = [gate.line_up("a", second), gate.line_up("a", third)]
    served: list[Run] = []

    async def wait(index: int, run: Run) -> None:
        await places[index].wait()
        served.append(run)
        gate.release("a")

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, 1, third)  # the later place starts waiting first
        tg.start_soon(wait, 0, second)
        await anyio.wait_all_tasks_blocked()
        gate.release("a")
    assert served == [second, third]
    assert gate.free == 1


async def test_a_place_left_before_its_wait_gives_back_its_slot_or_its_turn() -> None:
    gate = SlotGate(1, share=1)
    at_once = Run()
    first = gate.line_up("a", at_once)  # a free slot: taken at once
    assert at_once.slotted and gate.free == 0
    first.leave()  # the run ended before it waited: the slot is given back
    assert not at_once.slotted and gate.free == 1

    holder, waiting, behind = Run(), Run(), Run()
    assert gate.try_acquire("a", holder)
    left = gate.line_up("a", waiting)
    place = gate.line_up("a", behind)
    gate.release("a")  # handed to the first in line, which never waits for it
    assert waiting.slotted and gate.free == 0
    left.leave()  # passed on to the next in line
    assert not waiting.slotted and behind.slotted
    await place.wait()  # already granted: returns at once
    place.leave()  # after its wait, the slot is the caller's: leaving changes nothing
    assert gate.free == 0
    gate.release("a")
    assert gate.free == 1


async def test_a_place_cancelled_while_waiting_leaves_the_line() -> None:
    gate = SlotGate(1, share=1)
    assert gate.try_acquire("a", Run())
    place = gate.line_up("a", Run())
    with anyio.CancelScope() as scope:
        scope.cancel()
        await place.wait()
    gate.release("a")  # nobody waits any more: the slot stays free
    assert gate.free == 1
