"""A run's contexts stay pinned a moment after its answer (the pins' release waits until the
answer is out), so a context deleted right after the answer would be refused as "in use by a
running run": `RunManager.let_go` waits for the runs that have ended but still pin it, and
`Caller.delete_context` tries again after it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings, submit

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")


class _HeldRelease:
    """The context store, its pins' release held until `let_out` is set."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.let_out = anyio.Event()

    def in_use(self, context_ids: Any, *, owner: Any, held: Any = None) -> Any:
        pins = held

        @asynccontextmanager
        async def held_() -> AsyncIterator[Any]:
            async with self._inner.in_use(context_ids, owner=owner, held=pins) as infos:
                try:
                    yield infos
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.let_out.wait()

        return held_()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_let_go_waits_for_an_ended_run_that_still_pins_the_context(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    engine = RLMEngine(settings.engine, FakeChatModel(root=[submit("'42'")]), FakeSandboxFactory())
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(b"text", name="ctx", format="text", source={"kind": "text"}, owner=ALICE)
        contexts = _HeldRelease(stores.contexts)
        async with RunManager(settings.runs, contexts, stores.runs, owners=configured_owners(settings.server)) as runs:
            assert not await runs.let_go(info.context_id, owner=ALICE)  # no run: nothing to wait for
            request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
            run = await runs.start(request, engine)
            with anyio.fail_after(30):
                await run.done.wait()
            assert not run.released.is_set()
            with pytest.raises(Exception, match="in use by a running run"):
                await stores.contexts.delete(info.context_id, owner=ALICE)

            waited: list[bool] = []

            async def let_go() -> None:
                waited.append(await runs.let_go(info.context_id, owner=ALICE))

            async with anyio.create_task_group() as tg:
                tg.start_soon(let_go)
                await anyio.wait_all_tasks_blocked()
                assert waited == []  # still waiting: the run's pins are held
                contexts.let_out.set()
            assert waited == [True] and run.released.is_set()
            assert await stores.contexts.delete(info.context_id, owner=ALICE)
            assert not await runs.let_go(info.context_id, owner=ALICE)
