"""RunStore / RunLog: records, bounds, ids."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.events import Cell, CellStart, ChatMessage, EventStub, LogTruncated, Turn, UnreadableEvent
from rlm_mcp.store import RunStore

pytestmark = pytest.mark.anyio


async def test_create_append_read(settings) -> None:
    runs = RunStore(settings)
    log = await runs.create("run_1", {"status": "running", "query": "q"})
    try:
        await log.append(CellStart(run_id="run_1", iteration=1, block=1, depth=0))
        await log.append(_cell("print(1)", "1"))
        await log.write_summary({"status": "completed", "answer": "42"})
    finally:
        await log.aclose()
    events = await runs.read_events("run_1")
    assert [type(e) for e in events] == [CellStart, Cell]
    assert all(isinstance(e, (CellStart, Cell)) and isinstance(e.ts, float) for e in events)
    assert events[1] == _cell("print(1)", "1").model_copy(update={"ts": events[1].ts})
    summary = await runs.read_summary("run_1")
    assert summary["status"] == "completed" and summary["run_id"] == "run_1" and "created_at" in summary
    first_line = len((Path(settings.data_dir) / "runs" / "run_1" / "events.jsonl").read_bytes().splitlines()[0]) + 1
    assert len(await runs.read_events("run_1", limit_bytes=first_line)) == 1


async def test_event_and_log_bounds(settings) -> None:
    runs = RunStore(settings, max_event_bytes=2000, max_log_bytes=6000)
    log = await runs.create("bounded", {})
    try:
        await log.append(_cell("short", "x" * 10_000))
        for i in range(20):
            await log.append(
                Turn(run_id="bounded", iteration=i, depth=0, new_messages=[ChatMessage(role="user", content="y" * 500)])
            )
    finally:
        await log.aclose()
    path = Path(settings.data_dir) / "runs" / "bounded" / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert all(len(line) <= 2000 for line in lines)
    assert path.stat().st_size <= 6000 + 1024
    events = [json.loads(line) for line in lines]
    assert "truncated" in events[0]["output"] and events[0]["code"] == "short"
    assert events[-1]["type"] == "log_truncated"
    assert sum(e["type"] == "log_truncated" for e in events) == 1
    # and each line reads back as its type: a cut cell is still a cell
    typed = await runs.read_events("bounded")
    assert isinstance(typed[0], Cell) and typed[0].code == "short" and "truncated" in typed[0].output
    assert isinstance(typed[-1], LogTruncated) and typed[-1].max_bytes == 6000


async def test_oversize_events_and_foreign_lines_read_back_without_error(settings) -> None:
    runs = RunStore(settings, max_event_bytes=100)
    log = await runs.create("odd", {})
    try:
        # too many fields to fit even with every string cut: only its kind and time are kept
        await log.append(Turn(run_id="odd", iteration=1, depth=0, new_messages=[]))
    finally:
        await log.aclose()
    path = Path(settings.data_dir) / "runs" / "odd" / "events.jsonl"
    # another version's event, a known kind in a shape it never had, not an object at all; lines
    # that are not JSON or not UTF-8 are skipped
    foreign_lines = b'{"type": "future_kind", "x": 1}\nnot json\n{"type": "cell", "code": 5}\n\xff\xfe\n[1, 2]\n'
    await anyio.Path(path).write_bytes(await anyio.Path(path).read_bytes() + foreign_lines)
    stub, *foreign = await runs.read_events("odd")
    assert isinstance(stub, EventStub) and stub.type == "turn" and isinstance(stub.ts, float)
    assert [type(e) for e in foreign] == [UnreadableEvent] * 3
    assert [e.raw for e in foreign if isinstance(e, UnreadableEvent)] == [
        {"type": "future_kind", "x": 1},
        {"type": "cell", "code": 5},
        [1, 2],
    ]


def _cell(code: str, output: str) -> Cell:
    return Cell(
        run_id="r",
        iteration=1,
        block=1,
        code=code,
        output=output,
        duration_s=0.5,
        error=None,
        timed_out=False,
        restarted=False,
        depth=0,
    )


async def test_unknown_and_invalid_ids(settings) -> None:
    runs = RunStore(settings)
    with pytest.raises(NotFoundError, match="Unknown run id 'nope'"):
        await runs.read_summary("nope")
    with pytest.raises(NotFoundError):
        await runs.read_events("nope")
    for bad in ("../etc", "a/b", "", "x" * 200, "run.1"):
        with pytest.raises(BadArgumentError, match="not a valid run id"):
            await runs.create(bad, {})
        with pytest.raises(BadArgumentError):
            await runs.read_summary(bad)
    log = await runs.create("dup", {})
    await log.aclose()
    with pytest.raises(BadArgumentError, match="already exists"):
        await runs.create("dup", {})


async def test_list_newest_first(settings) -> None:
    runs = RunStore(settings)
    assert await runs.list() == []
    for name in ("a", "b", "c"):
        log = await runs.create(name, {"n": name})
        await log.aclose()
    listed = await runs.list()
    assert [s["run_id"] for s in listed] == ["c", "b", "a"]
    assert [s["run_id"] for s in await runs.list(limit=2)] == ["c", "b"]


async def test_prune_keeps_the_newest_finished_and_drops_the_stale(settings) -> None:
    import os
    import time

    runs = RunStore(settings)
    for index, name in enumerate(("old1", "old2", "new1", "new2", "live")):
        log = await runs.create(name, {"status": "running"})
        if name != "live":
            await log.write_summary({"status": "completed", "result": {"answer": name}})
        await log.aclose()
        summary = Path(settings.data_dir) / "runs" / name / "summary.json"
        os.utime(summary, (time.time() - 100 + index, time.time() - 100 + index))  # a stable order
    stale = Path(settings.data_dir) / "runs" / "stale"
    log = await runs.create("stale", {"status": "running"})  # its server died long ago
    await log.aclose()
    os.utime(stale / "summary.json", (time.time() - 40 * 86400, time.time() - 40 * 86400))

    removed = await runs.prune(max_records=2, max_age_days=30)
    assert sorted(removed) == ["old1", "old2", "stale"]
    left = {s["run_id"] for s in await runs.list()}
    assert left == {"new1", "new2", "live"}  # a run still going is never pruned by count
    with pytest.raises(NotFoundError):
        await runs.read_summary("old1")
