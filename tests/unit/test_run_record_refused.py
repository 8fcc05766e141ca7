"""A run whose final record the store refuses for what it holds is recorded `error`, saying why,
and its caller is told the same (issue 41). The in-process sandbox hands the answer over without
the host's frame parser, which would have made it valid text: so the store meets the lone
surrogate itself, as it would any value it cannot take."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.runs import NoticeKind, RunRequest
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings, submit

pytestmark = pytest.mark.anyio


async def test_an_answer_the_store_refuses_ends_the_run_error_with_a_readable_record(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    engine = RLMEngine(settings.engine, FakeChatModel(root=[submit('"half \\ud83d an emoji"')]), FakeSandboxFactory())
    async with (
        make_stores(settings) as stores,
        RunManager(settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server)) as runs,
    ):
        info = await stores.contexts.put_bytes(
            b"x", name="ctx", format="text", source={"kind": "text"}, owner=LOCAL_OWNER
        )
        request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=LOCAL_OWNER)
        run = await runs.start(request, engine)
        await run.done.wait()
        stored = await stores.runs.read_summary(run.run_id, owner=LOCAL_OWNER)
    assert run.result is not None and run.result.status == "error" and run.result.answer is None
    assert stored.status == "error" and stored.result is not None and stored.result.answer is None
    assert stored.result.reason == run.result.reason
    assert "store refused the run's final record (UnicodeEncodeError" in (stored.result.reason or "")
    assert stored.notice is not None and stored.notice.kind is NoticeKind.RECORD_REFUSED
    assert stored.result.iterations == 1
