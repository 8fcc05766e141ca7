"""A run's contexts stay pinned until its answer is on its way: the pins' release (a worker-thread
hop in the embedded store) starts only after the caller woken by the run's end has had its loop
rounds to send the answer, instead of competing with it for the CPU."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store import ContextInfo
from rlm_mcp.store.context_model import HeldPins
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings, submit

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")


class OrderedPins:
    """The store's contexts, noting when a run's pins begin to be released."""

    def __init__(self, contexts: Any, journal: list[str]) -> None:
        self._contexts = contexts
        self._journal = journal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._contexts, name)

    @asynccontextmanager
    async def in_use(
        self, context_ids: Sequence[str], *, owner: Owner, held: HeldPins | None = None
    ) -> AsyncIterator[list[ContextInfo]]:
        async with self._contexts.in_use(context_ids, owner=owner, held=held) as infos:
            try:
                yield infos
            finally:
                self._journal.append("pins released")


async def test_the_pins_are_released_after_the_woken_caller_had_its_rounds(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    engine = RLMEngine(settings.engine, FakeChatModel(root=[submit("'42'")]), FakeSandboxFactory())
    journal: list[str] = []
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(
            b"The magic number is 42.", name="ctx", format="text", source={"kind": "text"}, owner=ALICE
        )
        contexts = OrderedPins(stores.contexts, journal)
        async with RunManager(settings.runs, contexts, stores.runs, owners=configured_owners(settings.server)) as runs:
            request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
            first = await runs.start(request, engine)  # its end also prunes old records (a thread hop)
            with anyio.fail_after(30):
                await first.done.wait()
                while "pins released" not in journal:
                    await checkpoint()
            journal.clear()
            engine.lm = FakeChatModel(root=[submit("'42'")])
            run = await runs.start(request, engine)
            with anyio.fail_after(30):
                await run.done.wait()
            # What an MCP call does from here: return through the SDK, whose writer task sends the
            # answer a round later.
            await checkpoint()
            await checkpoint()
            journal.append("answer sent")
            with anyio.fail_after(30):
                while "pins released" not in journal:
                    await checkpoint()
    assert journal == ["answer sent", "pins released"]
