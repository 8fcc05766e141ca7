"""Run records: records, bounds, ids, listing and pruning, over both stores (`store_settings`:
SQLite and files, then PostgreSQL)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.events import Cell, CellStart, ChatMessage, EventStub, LogTruncated, Turn, UnreadableEvent
from rlm_mcp.owners import EVERY_OWNER
from tests.fixtures_both_stores import add_event_lines, bounded_runs, event_lines, touch_run
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

StoreSettings = Callable[..., Settings]


async def test_create_append_read(store_settings: StoreSettings) -> None:
    settings = store_settings()
    async with make_stores(settings) as stores:
        runs = stores.runs
        log = await runs.create(run_record("run_1", {"status": "running", "query": "q"}))
        try:
            await log.append(CellStart(run_id="run_1", iteration=1, block=1, depth=0))
            await log.append(_cell("print(1)", "1"))
            await log.write_summary(run_record(log.run_id, {"status": "completed", "answer": "42"}))
        finally:
            await log.aclose()
        events = await runs.read_events("run_1", owner=EVERY_OWNER)
        assert [type(e) for e in events] == [CellStart, Cell]
        assert all(isinstance(e, (CellStart, Cell)) and isinstance(e.ts, float) for e in events)
        cell = events[1]
        assert isinstance(cell, Cell) and cell == _cell("print(1)", "1").model_copy(update={"ts": cell.ts})
        summary = await runs.read_summary("run_1", owner=EVERY_OWNER)
        assert summary.status == "completed" and summary.run_id == "run_1" and summary.created_at > 0
        first_line = len((await event_lines(stores, settings, "run_1"))[0])
        assert len(await runs.read_events("run_1", limit_bytes=first_line, owner=EVERY_OWNER)) == 1


async def test_event_and_log_bounds(store_settings: StoreSettings) -> None:
    settings = store_settings()
    async with make_stores(settings) as stores:
        runs = bounded_runs(stores, settings, max_event_bytes=2000, max_log_bytes=6000)
        log = await runs.create(run_record("bounded", {}))
        try:
            await log.append(_cell("short", "x" * 10_000))
            for i in range(20):
                new = [ChatMessage(role="user", content="y" * 500)]
                await log.append(Turn(run_id="bounded", iteration=i, depth=0, new_messages=new))
        finally:
            await log.aclose()
        lines = await event_lines(stores, settings, "bounded")
        assert all(len(line) <= 2000 for line in lines)
        assert sum(len(line) for line in lines) <= 6000 + 1024
        events = [json.loads(line) for line in lines]
        assert "truncated" in events[0]["output"] and events[0]["code"] == "short"
        assert events[-1]["type"] == "log_truncated"
        assert sum(e["type"] == "log_truncated" for e in events) == 1
        # and each line reads back as its type: a cut cell is still a cell
        typed = await runs.read_events("bounded", owner=EVERY_OWNER)
        assert isinstance(typed[0], Cell) and typed[0].code == "short" and "truncated" in typed[0].output
        assert isinstance(typed[-1], LogTruncated) and typed[-1].max_bytes == 6000


async def test_oversize_events_and_foreign_lines_read_back_without_error(store_settings: StoreSettings) -> None:
    settings = store_settings()
    async with make_stores(settings) as stores:
        runs = bounded_runs(stores, settings, max_event_bytes=100, max_log_bytes=64 << 20)
        log = await runs.create(run_record("odd", {}))
        try:
            # too many fields to fit even with every string cut: only its kind and time are kept
            await log.append(Turn(run_id="odd", iteration=1, depth=0, new_messages=[]))
        finally:
            await log.aclose()
        # another version's event, a known kind in a shape it never had, not an object at all; a
        # line that is not JSON is skipped (one that is not UTF-8 too: only a file can hold one)
        foreign = [b'{"type": "future_kind", "x": 1}', b"not json", b'{"type": "cell", "code": 5}', b"[1, 2]"]
        if stores.kind == "sqlite":
            foreign.insert(3, b"\xff\xfe")
        await add_event_lines(stores, settings, "odd", foreign)
        stub, *read = await runs.read_events("odd", owner=EVERY_OWNER)
    assert isinstance(stub, EventStub) and stub.type == "turn" and isinstance(stub.ts, float)
    assert [type(e) for e in read] == [UnreadableEvent] * 3
    assert [e.raw for e in read if isinstance(e, UnreadableEvent)] == [
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


async def test_unknown_and_invalid_ids(store_settings: StoreSettings) -> None:
    async with make_stores(store_settings()) as stores:
        runs = stores.runs
        with pytest.raises(NotFoundError, match="Unknown run id 'nope'"):
            await runs.read_summary("nope", owner=EVERY_OWNER)
        with pytest.raises(NotFoundError):
            await runs.read_events("nope", owner=EVERY_OWNER)
        for bad in ("../etc", "a/b", "", "x" * 200, "run.1"):
            with pytest.raises(BadArgumentError, match="not a valid run id"):
                await runs.create(run_record(bad, {}))
            with pytest.raises(BadArgumentError):
                await runs.read_summary(bad, owner=EVERY_OWNER)
        log = await runs.create(run_record("dup", {}))
        await log.aclose()
        with pytest.raises(BadArgumentError, match="already exists"):
            await runs.create(run_record("dup", {}))


async def test_list_newest_first(store_settings: StoreSettings) -> None:
    async with make_stores(store_settings()) as stores:
        runs = stores.runs
        assert await runs.list(owner=EVERY_OWNER) == []
        for name in ("a", "b", "c"):
            log = await runs.create(run_record(name, {"n": name}))
            await log.aclose()
        listed = await runs.list(owner=EVERY_OWNER)
        assert [s.run_id for s in listed] == ["c", "b", "a"]
        assert [s.run_id for s in await runs.list(limit=2, owner=EVERY_OWNER)] == ["c", "b"]


async def test_prune_keeps_the_newest_finished_and_drops_the_stale(store_settings: StoreSettings) -> None:
    settings = store_settings()
    async with make_stores(settings) as stores:
        runs = stores.runs
        now = time.time()
        for index, name in enumerate(("old1", "old2", "new1", "new2", "live")):
            log = await runs.create(run_record(name, {"status": "running"}))
            if name != "live":
                await log.write_summary(run_record(log.run_id, {"status": "completed", "result": {"answer": name}}))
            await log.aclose()
            await touch_run(stores, settings, name, now - 100 + index)  # a stable order
        log = await runs.create(run_record("stale", {"status": "running"}))  # its server died long ago
        await log.aclose()
        await touch_run(stores, settings, "stale", now - 40 * 86400)

        removed = await runs.prune(max_records=2, max_age_days=30)
        assert sorted(removed) == ["old1", "old2", "stale"]
        left = {s.run_id for s in await runs.list(owner=EVERY_OWNER)}
        assert left == {"new1", "new2", "live"}  # a run still going is never pruned by count
        with pytest.raises(NotFoundError):
            await runs.read_summary("old1", owner=EVERY_OWNER)
