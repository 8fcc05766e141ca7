"""Where the embedded run store does a run's record writes: a small record (the usual one) is
written on the event loop, with no worker-thread hop on the caller's path (the record exists
before the run starts; the final one is written before the caller wakes); a large one still goes
to a worker thread. Either way the file reads back the same, and it is replaced atomically."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from rlm_mcp.events import TurnStart
from rlm_mcp.file_work import INLINE_FILE_BYTES
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER
from rlm_mcp.ports.runs import RunLimits, RunRecord, RunRequest, RunResult
from rlm_mcp.store.runs import RunStore
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.usage import Usage

T = TypeVar("T")
LIMITS = RunLimits(max_iterations=3, max_depth=1, timeout_s=60.0, token_budget=None, max_errors=2)


def _record() -> RunRecord:
    request = RunRequest(query="what?", context_ids=["ctx"], owner=LOCAL_OWNER, limits=LIMITS)
    return RunRecord(run_id="run_w1", created_at=1_700_000_000.0, request=request)


def _ended(record: RunRecord, answer: str) -> RunRecord:
    result = RunResult(
        status="completed",
        answer=answer,
        reason=None,
        run_id=record.run_id,
        iterations=1,
        usage=Usage(),
        duration_s=0.5,
        sub_calls=0,
    )
    return record.model_copy(update={"status": "completed", "result": result})


@pytest.mark.parametrize(("answer", "hops"), [("42", 0), ("x" * (INLINE_FILE_BYTES + 1), 1)])
def test_a_runs_record_writes_hop_to_a_thread_only_when_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str, hops: int
) -> None:
    threads: list[str] = []
    real = anyio.to_thread.run_sync

    async def counted(func: Callable[[], T], *args: object, **kwargs: object) -> T:
        threads.append(getattr(func, "__name__", "?"))
        return await real(func, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)  # every worker-thread hop, whoever asks
    store = RunStore(make_settings(data_dir=tmp_path / "data").store)
    record = _record()

    async def run() -> RunRecord:
        log = await store.create(record)
        await log.open()
        await log.append(TurnStart(run_id=record.run_id, iteration=1, max_iterations=3, depth=0))
        final = _ended(record, answer)
        await log.write_summary(final)
        await log.aclose()
        return await store.read_summary(record.run_id, owner=EVERY_OWNER)

    read = anyio.run(run)
    assert read.result is not None and read.result.answer == answer
    # the read is one hop; create, open, append, the final write and the close take none when small
    assert len(threads) == 1 + hops
    run_dir = tmp_path / "data" / "runs" / record.run_id
    assert sorted(p.name for p in run_dir.iterdir()) == ["events.jsonl", "summary.json"]  # no temporary left
    assert json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["status"] == "completed"
    assert [json.loads(line)["type"] for line in (run_dir / "events.jsonl").read_text().splitlines()] == ["turn_start"]
