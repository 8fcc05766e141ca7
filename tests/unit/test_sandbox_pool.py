"""The warm pool keeps at most its size, whoever fills it: its refill, or a container started
elsewhere and offered (a worker's first kernel, booted to learn whether the image can snapshot)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import anyio
import pytest

from rlm_mcp.ports.kernel import KernelChannel
from rlm_mcp.sandbox.pool import WarmPool
from rlm_mcp.testing.waiting import wait_until


@dataclass(eq=False)
class Container:
    """What the pool reads of a container: whether it has stopped."""

    name: str
    eof: bool = False
    closed: bool = False


class Starts:
    """The pool's `start` and `discard`: each start waits until the test lets it finish."""

    def __init__(self) -> None:
        self.begun: list[Container] = []
        self.discarded: list[Container] = []
        self.finish = anyio.Event()

    async def start(self) -> KernelChannel:
        container = Container(f"refill-{len(self.begun)}")
        self.begun.append(container)
        await self.finish.wait()
        return cast(KernelChannel, container)

    async def discard(self, container: KernelChannel) -> None:
        self.discarded.append(cast(Container, container))


@pytest.mark.anyio
async def test_a_container_offered_while_the_refill_starts_one_keeps_the_pool_at_its_size() -> None:
    starts = Starts()
    pool = WarmPool(1, starts.start, starts.discard)
    offered = cast(KernelChannel, Container("offered"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.refill_forever)
        await wait_until(lambda: len(starts.begun) == 1, within_s=30, what="the refill's start begun")
        assert pool.offer(offered)  # the pool was empty: the offered one is kept
        starts.finish.set()
        await wait_until(lambda: len(starts.discarded) == 1, within_s=30, what="the refill's container discarded")
        assert len(pool) == 1
        assert pool.take() is offered
        tg.cancel_scope.cancel()
    assert [c.name for c in starts.discarded] == ["refill-0"]


@pytest.mark.anyio
async def test_an_offer_to_a_full_pool_is_refused() -> None:
    starts = Starts()
    starts.finish.set()
    pool = WarmPool(1, starts.start, starts.discard)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.refill_forever)
        await wait_until(lambda: len(pool) == 1, within_s=30, what="the pool filled")
        assert not pool.offer(cast(KernelChannel, Container("offered")))
        tg.cancel_scope.cancel()
    assert len(pool) == 1
    assert starts.discarded == []  # a refused offer is the caller's to discard


def test_an_empty_pool_refuses_a_stopped_container_and_keeps_a_live_one() -> None:
    starts = Starts()
    pool = WarmPool(2, starts.start, starts.discard)  # no refill running: only offers fill it
    assert not pool.offer(cast(KernelChannel, Container("exited", eof=True)))
    assert not pool.offer(cast(KernelChannel, Container("closed", closed=True)))
    live = cast(KernelChannel, Container("live"))
    assert pool.offer(live)
    assert len(pool) == 1 and pool.take() is live
