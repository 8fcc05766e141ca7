"""QuietGate: background Docker work waits while a sandbox is in use, and never forever."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint

from rlm_mcp.sandbox.quiet import QuietGate

pytestmark = pytest.mark.anyio


async def test_waits_until_no_sandbox_is_in_use() -> None:
    gate = QuietGate(settle_s=0.0, max_wait_s=3600)
    returned: list[str] = []

    async def waiter() -> None:
        await gate.wait_quiet()
        returned.append("quiet")

    async with anyio.create_task_group() as tg:
        async with gate.in_use():
            async with gate.in_use():
                tg.start_soon(waiter)
                await wait_all_tasks_blocked()
                assert returned == [] and gate.busy == 2
            await wait_all_tasks_blocked()
            assert returned == [] and gate.busy == 1  # one sandbox still in use
        with anyio.fail_after(30):
            while not returned:
                await checkpoint()
    assert returned == ["quiet"] and gate.busy == 0


async def test_idle_gate_opens_and_a_busy_one_opens_after_max_wait() -> None:
    idle = QuietGate(settle_s=0.0, max_wait_s=3600)
    with anyio.fail_after(30):
        await idle.wait_quiet()  # nothing in use: returns after the settle time
    never_idle = QuietGate(settle_s=0.0, max_wait_s=0.05)
    async with never_idle.in_use():
        with anyio.fail_after(30):
            await never_idle.wait_quiet()  # a server that is never idle still gets its turn
        assert never_idle.busy == 1


async def test_a_use_that_starts_and_ends_within_the_settle_time_restarts_it() -> None:
    gate = QuietGate(settle_s=3600, max_wait_s=7200)
    async with anyio.create_task_group() as tg:
        tg.start_soon(gate.wait_quiet)
        await wait_all_tasks_blocked()
        generation = gate._generation
        async with gate.in_use():
            pass
        assert gate._generation == generation + 1  # the waiter will see it and settle again
        tg.cancel_scope.cancel()


async def test_a_waiter_may_bound_its_own_wait() -> None:
    """The pool's refill waits longer than removals (REFILL_MAX_WAIT_S): each waiter its own bound."""
    gate = QuietGate(settle_s=0.0, max_wait_s=3600)
    async with gate.in_use():
        with anyio.fail_after(30):
            await gate.wait_quiet(0.05)  # busy all along: returns after its own bound, not the gate's
        assert gate.busy == 1


def test_a_pool_below_half_refills_within_the_gates_own_bound() -> None:
    """The long refill wait holds only while the pool keeps at least half its size: a burst that
    drains it further gets its refill started within the gate's bound, not the long one."""
    from rlm_mcp.sandbox.quiet import REFILL_MAX_WAIT_S, refill_wait_s

    assert refill_wait_s(6, 6) == REFILL_MAX_WAIT_S
    assert refill_wait_s(3, 6) == REFILL_MAX_WAIT_S
    assert refill_wait_s(2, 6) is None
    assert refill_wait_s(1, 6) is None
    assert refill_wait_s(1, 1) == REFILL_MAX_WAIT_S
