"""A team worker's run log (`service/queue/runlog.py`): events are staged and written in
batches, yet the first answered LM call is recorded (row and `lm_called` mark) before `append`
returns, a publish writes the staged events, the summary and the NOTIFY together, order by
sequence holds across flushes and a failed flush, and a summary never lands over a final one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import pytest
from psycopg.rows import dict_row

from rlm_mcp.assembly import make_stores
from rlm_mcp.call_lines import CallLine, call_line
from rlm_mcp.events import Cell, LLMCall, TurnStart, loads
from rlm_mcp.owners import Owner
from rlm_mcp.ports.queue import RunRow
from rlm_mcp.ports.runs import decode_announcement, decode_live, encode_live
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.store.pg import Database, DatabaseUnavailableError
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.queue_statements import run_channel
from rlm_mcp.store.pg.run_log import PgRunLog
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_postgres import Cluster
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

ALICE = Owner("token-alice")
RUN = "run_batched00000001"


def _turn(n: int) -> TurnStart:
    return TurnStart(run_id=RUN, iteration=n, max_iterations=9, depth=0)


def _cell(n: int) -> Cell:
    return Cell(
        run_id=RUN, iteration=n, block=0, code="print()", output="x", duration_s=0.1, error=None,
        timed_out=False, restarted=False, depth=0,
    )  # fmt: skip


def _line(n: int, error: str | None = None) -> CallLine:
    return call_line(
        run_id=RUN, role="root", model="m", prompt_tokens=1, completion_tokens=1, latency_s=0.01,
        finish_reason=None if error else "stop", error=error, depth=0, iteration=n,
    )  # fmt: skip


def _call(n: int, error: str | None = None) -> LLMCall:
    return LLMCall(
        run_id=RUN, role="root", model="m", prompt_tokens=1, completion_tokens=1, latency_s=0.01,
        status="error" if error else "ok", finish_reason=None if error else "stop", error=error, depth=0, iteration=n,
    )  # fmt: skip


async def _rows(url: str) -> tuple[list[str], dict[str, Any]]:
    """The run's event types in sequence order, and its record."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cur = await conn.execute("SELECT seq, line::jsonb ->> 'type' AS type FROM rlm_run_events WHERE run_id = %s "
                                 "ORDER BY seq", (RUN,))  # fmt: skip
        events = await cur.fetchall()
        cur = await conn.execute("SELECT summary, done, lm_called, next_seq FROM rlm_runs WHERE run_id = %s", (RUN,))
        record = await cur.fetchone()
    assert record is not None
    assert [e["seq"] for e in events] == list(range(len(events)))  # no gap, no duplicate
    return [e["type"] for e in events], record


async def test_events_are_batched_but_the_first_lm_reply_is_recorded_before_append_returns(
    tmp_path: Path, pg_url: str
) -> None:
    async with make_stores(make_settings(tmp_path, database_url=pg_url)) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database) and isinstance(stores.runs, PgRunStore)
        await stores.runs.create(run_record(RUN, {"status": "queued", "owner": ALICE}))
        log = QueueRunLog(await stores.runs.reopen(RUN))
        await log.append(_turn(1))
        await log.append(_call(1, error="the endpoint refused"))  # a failed call: staged like any event
        assert (await _rows(pg_url))[0] == [] and log.staged == 2
        assert not (await _rows(pg_url))[1]["lm_called"]
        # A live summary whose usage counts the failed call (it came back with a record) does not
        # mark the run: only an answered call does, so a lost worker's run may still go back.
        failed_usage = {"total": {"calls": 1, "prompt_tokens": 10, "completion_tokens": 0}}
        assert await log.publish(run_record(RUN, {"status": "running", "owner": ALICE, "usage": failed_usage}))
        assert not (await _rows(pg_url))[1]["lm_called"] and not log.lm_called

        await log.append(_call(1))  # the first answered call: written, with the mark, before it returns
        types, record = await _rows(pg_url)
        assert types == ["turn_start", "llm_call", "llm_call"] and record["lm_called"] and log.staged == 0
        assert log.lm_called

        await log.append(_cell(1))
        await log.append(_turn(2))
        await log.append(_call(2))  # later answers are staged: the requeue rule is settled already
        assert log.staged == 3

        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as listener:
            await listener.execute(f"LISTEN {run_channel(RUN)}")  # the run's own channel
            assert await log.publish(run_record(RUN, {"status": "running", "iterations": 2, "owner": ALICE}))
            notes = [n.payload async for n in listener.notifies(timeout=10, stop_after=1)]
        run_id, live = decode_live(notes[0])  # the live summary rides along: no row to read
        assert run_id == RUN and live is not None and live.iterations == 2
        types, record = await _rows(pg_url)
        assert types == ["turn_start", "llm_call", "llm_call", "cell", "turn_start", "llm_call"]
        assert '"iterations": 2' in record["summary"] and record["next_seq"] == 6 and not record["done"]

        # Another process ends the run (a sweeper): the worker's next publish writes its events
        # and counters but not its summary, and says the run is over.
        queue = PgRunQueue(queue_rules(make_settings(tmp_path, database_url=pg_url).queue), db)
        assert await queue.finish(RUN, run_record(RUN, {"status": "error", "result": {"status": "error"}}))
        await log.append(_cell(2))
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as listener:
            await listener.execute(f"LISTEN {run_channel(RUN)}")  # the run's own channel
            assert not await log.publish(run_record(RUN, {"status": "running", "iterations": 3, "owner": ALICE}))
            notes = [n.payload async for n in listener.notifies(timeout=10, stop_after=1)]
        assert notes == [RUN]  # the id alone: the follower reads the final row
        types, record = await _rows(pg_url)
        assert types[-1] == "cell" and record["next_seq"] == 7 and record["done"]
        assert '"status": "error"' in record["summary"]


async def test_a_failed_flush_keeps_its_events_for_the_next_one_in_order(
    tmp_path: Path, pg_cluster: Cluster, pg_url: str
) -> None:
    async with make_stores(make_settings(tmp_path, database_url=pg_url)) as stores:
        assert isinstance(stores.runs, PgRunStore)
        await stores.runs.create(run_record(RUN, {"status": "queued", "owner": ALICE}))
        log = QueueRunLog(await stores.runs.reopen(RUN))
        await log.append(_turn(1))
        await log.append(_call(1))
        await log.append(_cell(1))
        pg_cluster.stop()
        try:
            await log.append(_turn(2))
            with pytest.raises(DatabaseUnavailableError):
                await log.publish(run_record(RUN, {"status": "running", "owner": ALICE}))
            assert log.staged == 2
        finally:
            pg_cluster.start()
        await log.append(_call(2))
        await log.write_summary(
            run_record(log.run_id, {"status": "completed", "owner": ALICE, "result": {"status": "completed"}})
        )
        await log.aclose()
        types, record = await _rows(pg_url)
        assert types == ["turn_start", "llm_call", "cell", "turn_start", "llm_call"]
        assert record["done"] and record["next_seq"] == 5


async def test_an_lm_calls_line_is_staged_and_marked_as_its_event_is(tmp_path: Path, pg_url: str) -> None:
    """`append_call` (the engine's LM call events, no model built): the same row as `append` of
    the event, and the first answered call written with the `lm_called` mark before it returns."""
    async with make_stores(make_settings(tmp_path, database_url=pg_url)) as stores:
        assert isinstance(stores.runs, PgRunStore)
        await stores.runs.create(run_record(RUN, {"status": "queued", "owner": ALICE}))
        log = QueueRunLog(await stores.runs.reopen(RUN))
        failed = _line(1, error="the endpoint refused")
        await log.append_call(failed)  # a failed call: staged like any event
        assert log.staged == 1 and not (await _rows(pg_url))[1]["lm_called"]
        await log.append_call(_line(1))  # the first answered call: written, with the mark
        types, record = await _rows(pg_url)
        assert types == ["llm_call", "llm_call"] and record["lm_called"] and log.staged == 0
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT line FROM rlm_run_events WHERE run_id = %s ORDER BY seq", (RUN,))
            lines = [row[0] async for row in cur]
        assert [loads(line) for line in lines][0] == failed.event().model_copy(
            update={"ts": json.loads(lines[0])["ts"]}
        )


class _Claimed(NamedTuple):
    db: Database
    runs: PgRunStore
    queue: PgRunQueue
    worker: int
    first: RunRow


async def _claimed(stores: Any, settings: Any, owner: str) -> _Claimed:
    """The run enqueued and claimed once by a new worker of `owner`."""
    db, runs = stores.lifecycle, stores.runs
    assert isinstance(db, Database) and isinstance(runs, PgRunStore)
    queue = PgRunQueue(queue_rules(settings.queue), db)
    worker = await queue.register_worker(owner, 2)
    await queue.enqueue(run_record(RUN, {"status": "queued", "owner": ALICE}), 1)
    first = await queue.claim(worker, 2, 2)
    assert first is not None and first.attempt == 1
    return _Claimed(db, runs, queue, worker, first)


async def _claimed_again(queue: PgRunQueue, worker: int) -> RunRow:
    """The first attempt given back to the queue and the run claimed again: attempt 2."""
    assert await queue.requeue(RUN, 1, run_record(RUN, {"status": "queued", "owner": ALICE}))
    second = await queue.claim(worker, 2, 2)
    assert second is not None and second.attempt == 2
    return second


def _count_lends(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A list that grows by one each time `db` lends a connection (until `monkeypatch.undo`)."""
    used: list[object] = []
    lend = db.connection

    def counted() -> Any:
        used.append(1)
        return lend()

    monkeypatch.setattr(db, "connection", counted)
    return used


async def test_a_claimed_runs_log_goes_on_from_the_claims_row_without_reading_it(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        db, runs, queue, worker, first = await _claimed(stores, settings, "owner-claimed")
        log = QueueRunLog(runs.reopen_claimed(first))
        await log.append(_turn(1))
        await log.append(_call(1))  # the first answered call: written at once
        second = await _claimed_again(queue, worker)
        assert second.next_seq == 2

        used = _count_lends(db, monkeypatch)
        again = QueueRunLog(runs.reopen_claimed(second))
        assert used == []  # the claim's row said where the log goes on: nothing read
        monkeypatch.undo()

        await again.append(_turn(1))
        await again.write_summary(run_record(RUN, {"status": "running", "iterations": 1, "owner": ALICE}))
        types, record = await _rows(pg_url)  # sequences without a gap or a duplicate
        assert types == ["turn_start", "llm_call", "turn_start"] and record["next_seq"] == 3


async def test_the_final_record_and_the_last_events_are_one_fenced_statement(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's log ends its run with the events still staged in one statement (the end write
    of the queue, fenced by the attempt) and announces the final record with it; a former
    attempt's log writes neither, says so, and announces the run id alone (its record is not
    the run's)."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        db, runs, queue, worker, first = await _claimed(stores, settings, "owner-finish")
        stale = runs.reopen_claimed(first)
        stale.stage(_turn(1))
        second = await _claimed_again(queue, worker)
        final = run_record(RUN, {"status": "running", "owner": ALICE}).ended("cancelled", "stopped by its caller")
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as listener:
            await listener.execute(f"LISTEN {run_channel(RUN)}")
            assert not await stale.finish(final)  # fenced: not this attempt's run any more
            refused = await anext(listener.notifies(timeout=30))
        assert refused.payload == RUN
        types, record = await _rows(pg_url)
        assert types == [] and not record["done"]

        fenced = runs.reopen_claimed(second)
        fenced.stage(_turn(1))
        fenced.stage(_cell(1))
        used = _count_lends(db, monkeypatch)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as listener:
            await listener.execute(f"LISTEN {run_channel(RUN)}")
            assert await fenced.finish(final)
            note = await anext(listener.notifies(timeout=30))
        monkeypatch.undo()
        assert len(used) == 1  # one statement
        # The wake-up carries the final record as a front reading the row gets it; to an
        # earlier version's reader it names the run alone (it reads the row, as before).
        row = await queue.read(RUN)
        assert row is not None and row.summary.done
        assert decode_announcement(note.payload) == (RUN, row.summary)
        assert decode_live(note.payload) == (RUN, None)
        types, record = await _rows(pg_url)
        assert types == ["turn_start", "cell"] and record["done"] and record["next_seq"] == 2
        assert not await fenced.finish(final)  # ended already: this call did not end it


def test_a_live_publish_sends_the_announcement_encode_live_would_build() -> None:
    """The publish reuses its record's tail as the announcement's JSON: the same text as
    `encode_live`'s, a notice and per-model usage included, and its fallbacks when too long."""
    log = PgRunLog(None, RUN, created_at=0.0, max_event_bytes=1000, max_log_bytes=10_000)  # type: ignore[arg-type]
    usage = {"total": {"calls": 2, "prompt_tokens": 10, "completion_tokens": 3}}
    fields = {"status": "running", "iterations": 2, "owner": ALICE, "phase": "cell", "last_event": "turn 2"}
    small = run_record(RUN, fields | {"usage": usage | {"by_model": {"m": usage["total"]}}})
    many = {f"model-{n:04d}": usage["total"] for n in range(200)}  # too long with its per-model usage
    large = run_record(RUN, fields | {"usage": usage | {"by_model": many}})
    for record in (small, large):
        stored, tail = log._dump_parts(record)
        assert json.loads(stored) == record.to_stored()
        assert log._live_payload(record, tail) == encode_live(RUN, record)
    assert len(encode_live(RUN, large)) < len(json.dumps(large.to_stored()))  # the fallback was taken


async def test_a_flush_of_many_events_writes_each_line_as_staged_and_fenced(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush of many rows (more than a few) writes every line byte for byte, quotes,
    backslashes and non-ASCII text included, in order, with one statement text whatever the
    number of rows (the driver converts it once); a former attempt's flush of many rows lands none."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        _, runs, queue, worker, first = await _claimed(stores, settings, "owner-many")
        texts: list[str] = []
        execute = psycopg.AsyncConnection.execute

        async def seen(conn: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            if "INSERT INTO rlm_run_events" in str(query):
                texts.append(str(query))
            return await execute(conn, query, params, **kw)

        monkeypatch.setattr(psycopg.AsyncConnection, "execute", seen)
        stale = runs.reopen_claimed(first)
        for n in range(40):
            stale.stage(_turn(n))
        second = await _claimed_again(queue, worker)
        assert not await stale.flush()  # not this attempt's run any more: nothing lands
        assert (await _rows(pg_url))[0] == []

        log = runs.reopen_claimed(second)
        cells = [
            Cell(run_id=RUN, iteration=n, block=0, code='print("\\\\", n)', output=f'é "{n}" \\ ∑ {"x" * n}',
                 duration_s=0.1, error=None, timed_out=False, restarted=False, depth=0)
            for n in range(40)
        ]  # fmt: skip
        log.stage(cells[0])
        assert await log.flush()
        for cell in cells[1:]:
            log.stage(cell)
        assert await log.flush()
        monkeypatch.undo()
        assert len(texts) == 3 and len(set(texts)) == 1  # 40, 1 and 39 rows: one text
        types, record = await _rows(pg_url)
        assert types == ["cell"] * 40 and record["next_seq"] == 40
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT line FROM rlm_run_events WHERE run_id = %s ORDER BY seq", (RUN,))
            lines = [row[0] async for row in cur]
        assert [loads(line) for line in lines] == [
            cell.model_copy(update={"ts": json.loads(line)["ts"]}) for cell, line in zip(cells, lines, strict=True)
        ]
