"""A run takes its sandbox from the opener (engine/opening.py) without a loop round once it is
open: the first reply waits on it, and waiting on a set event takes one."""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest

from rlm_mcp.engine.opening import SandboxOpener
from rlm_mcp.engine.session import Opened, Opening

pytestmark = pytest.mark.anyio


class _Ready:
    keeps = False

    def __init__(self, opened: Opened) -> None:
        self.opened = opened

    async def open(self, opening: Opening) -> Opened:
        return self.opened


async def test_an_open_sandbox_is_taken_without_a_loop_round() -> None:
    opened = Opened(cast(Any, object()))
    opener = SandboxOpener(_Ready(opened), cast(Opening, None), after=lambda _: None)
    ran: list[str] = []
    async with anyio.create_task_group() as tg:
        opener.release()
        await opener.run(tg.cancel_scope)
        assert opener.done

        async def other() -> None:
            ran.append("other")

        tg.start_soon(other)  # runs at this task's next yield
        got = await opener.get()
        ran.append("got")
    assert got is opened
    assert ran == ["got", "other"]
