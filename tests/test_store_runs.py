"""RunStore / RunLog: records, bounds, ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.store import RunStore

pytestmark = pytest.mark.anyio


async def test_create_append_read(settings) -> None:
    runs = RunStore(settings)
    log = await runs.create("run_1", {"status": "running", "query": "q"})
    try:
        await log.append({"type": "run_start", "config": {"model": "m"}})
        await log.append({"type": "cell", "code": "print(1)", "output": "1"})
        await log.write_summary({"status": "completed", "answer": "42"})
    finally:
        await log.aclose()
    events = await runs.read_events("run_1", owner=EVERY_OWNER)
    assert [e["type"] for e in events] == ["run_start", "cell"]
    assert all(isinstance(e["ts"], float) for e in events)
    summary = await runs.read_summary("run_1", owner=EVERY_OWNER)
    assert summary["status"] == "completed" and summary["run_id"] == "run_1" and "created_at" in summary
    first_line = len((Path(settings.data_dir) / "runs" / "run_1" / "events.jsonl").read_bytes().splitlines()[0]) + 1
    assert len(await runs.read_events("run_1", limit_bytes=first_line, owner=EVERY_OWNER)) == 1


async def test_event_and_log_bounds(settings) -> None:
    runs = RunStore(settings, max_event_bytes=2000, max_log_bytes=6000)
    log = await runs.create("bounded", {})
    try:
        await log.append({"type": "cell", "output": "x" * 10_000, "code": "short"})
        for i in range(20):
            await log.append({"type": "turn", "n": i, "text": "y" * 500})
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


async def test_unknown_and_invalid_ids(settings) -> None:
    runs = RunStore(settings)
    with pytest.raises(NotFoundError, match="Unknown run id 'nope'"):
        await runs.read_summary("nope", owner=EVERY_OWNER)
    with pytest.raises(NotFoundError):
        await runs.read_events("nope", owner=EVERY_OWNER)
    for bad in ("../etc", "a/b", "", "x" * 200, "run.1"):
        with pytest.raises(BadArgumentError, match="not a valid run id"):
            await runs.create(bad, {})
        with pytest.raises(BadArgumentError):
            await runs.read_summary(bad, owner=EVERY_OWNER)
    log = await runs.create("dup", {})
    await log.aclose()
    with pytest.raises(BadArgumentError, match="already exists"):
        await runs.create("dup", {})


async def test_list_newest_first(settings) -> None:
    runs = RunStore(settings)
    assert await runs.list(owner=EVERY_OWNER) == []
    for name in ("a", "b", "c"):
        log = await runs.create(name, {"n": name})
        await log.aclose()
    listed = await runs.list(owner=EVERY_OWNER)
    assert [s["run_id"] for s in listed] == ["c", "b", "a"]
    assert [s["run_id"] for s in await runs.list(limit=2, owner=EVERY_OWNER)] == ["c", "b"]


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
    left = {s["run_id"] for s in await runs.list(owner=EVERY_OWNER)}
    assert left == {"new1", "new2", "live"}  # a run still going is never pruned by count
    with pytest.raises(NotFoundError):
        await runs.read_summary("old1", owner=EVERY_OWNER)
