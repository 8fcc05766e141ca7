"""A run's last step (its pins' release) waits a few loop rounds for its answer to go out
(`run_execution.answer_first`) only where the answer goes out from this process: a run `start`
began here. A team worker's adopted run is answered by a front elsewhere (and its final write
releases the pins itself), so its end takes no such rounds."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.call_lines import CallLine
from rlm_mcp.engine import RLMEngine
from rlm_mcp.events import RunEvent
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunRecord, RunRequest
from rlm_mcp.service import runs as runs_module
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings, submit

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")


class _Log:
    """An adopted run's log (a worker's is the queue's fenced one): keeps the final record."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id
        self.final: RunRecord | None = None

    @property
    def run_id(self) -> str:
        return self._run_id

    async def open(self) -> None:
        pass

    async def append(self, event: RunEvent) -> None:
        pass

    async def append_call(self, call: CallLine) -> None:
        pass

    async def write_summary(self, record: RunRecord) -> None:
        self.final = record

    async def aclose(self) -> None:
        pass


async def test_only_a_run_answered_here_waits_for_its_answer_before_its_last_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[str] = []

    async def counted() -> None:
        waited.append("answer_first")

    monkeypatch.setattr(runs_module, "answer_first", counted)
    settings = make_settings(tmp_path)
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(b"text", name="ctx", format="text", source={"kind": "text"}, owner=ALICE)
        request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
        async with RunManager(
            settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server)
        ) as runs:
            started = await runs.start(
                request, RLMEngine(settings.engine, FakeChatModel(root=[submit("'42'")]), FakeSandboxFactory())
            )
            with anyio.fail_after(30):
                await started.released.wait()
            assert started.result is not None and started.result.answer == "42"
            assert waited == ["answer_first"]

            log = _Log("run_adopted000000001")
            engine = RLMEngine(settings.engine, FakeChatModel(root=[submit("'43'")]), FakeSandboxFactory())
            adopted = await runs.adopt(log.run_id, request, engine, log)
            with anyio.fail_after(30):
                await adopted.released.wait()
            assert adopted.result is not None and adopted.result.answer == "43"
            assert log.final is not None and log.final.done
            assert waited == ["answer_first"]  # none for the adopted run
