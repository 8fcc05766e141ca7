"""The process's writer of its runs' log flushes (`store/pg/log_writer.py`): the flushes of several
runs pending at once go in one statement, a flush asked while a write is in flight joins the next,
and every guarantee of a run's own flush holds per run: fencing by attempt, a pruned record that
fails nobody else, a failed statement that keeps every run's rows staged, the order of a run's
rows, its own answer and its own NOTIFY; the first answered call's mark waits for no tick."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from anyio import wait_all_tasks_blocked
from psycopg.rows import dict_row

from rlm_mcp import ticks
from rlm_mcp.assembly import make_stores
from rlm_mcp.events import LLMCall, TurnStart
from rlm_mcp.owners import Owner
from rlm_mcp.ports.queue import RunRow
from rlm_mcp.ports.runs import decode_announcement
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.store.pg import Database, DatabaseUnavailableError
from rlm_mcp.store.pg.log_writer import BATCH_FLUSH
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.queue_statements import run_channel
from rlm_mcp.store.pg.run_log import PgRunLog
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

ALICE = Owner("token-alice")


def _run(k: int) -> str:
    return f"run_writer{k:010d}"


def _turn(run_id: str, n: int) -> TurnStart:
    return TurnStart(run_id=run_id, iteration=n, max_iterations=99, depth=0)


def _live(run_id: str, iterations: int) -> Any:
    return run_record(run_id, {"status": "running", "iterations": iterations, "owner": ALICE})


class _Statements:
    """The batch statements the driver was asked to run, each with its runs; `hold` keeps the
    next one from being sent until `release`; `fail` makes the next one fail."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.held: anyio.Event | None = None
        self.sent = anyio.Event()
        self.fail = False


@contextmanager
def _statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Statements]:
    seen = _Statements()
    execute = psycopg.AsyncConnection.execute

    async def spy(conn: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if query == BATCH_FLUSH:
            seen.batches.append(list(params[0]))
            seen.sent.set()
            if seen.held is not None:
                held, seen.held = seen.held, None
                await held.wait()
            if seen.fail:
                seen.fail = False
                raise psycopg.OperationalError("the server closed the connection")
        return await execute(conn, query, params, **kw)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", spy)
    try:
        yield seen
    finally:
        monkeypatch.undo()


async def _claimed_runs(
    stores: Any, settings: Any, n: int
) -> tuple[Database, PgRunStore, PgRunQueue, int, list[RunRow]]:
    db, runs = stores.lifecycle, stores.runs
    assert isinstance(db, Database) and isinstance(runs, PgRunStore)
    queue = PgRunQueue(queue_rules(settings.queue), db)
    worker = await queue.register_worker("owner-writer", 2 * n)
    rows = []
    for k in range(n):
        await queue.enqueue(run_record(_run(k), {"status": "queued", "owner": ALICE}), 1)
        row = await queue.claim(worker, 2 * n, 2 * n)
        assert row is not None and row.run_id == _run(k)
        rows.append(row)
    return db, runs, queue, worker, rows


async def _events(url: str, run_id: str) -> tuple[list[int], dict[str, Any] | None]:
    """The run's events' iterations in sequence order (no gap, no duplicate), and its record."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cur = await conn.execute("SELECT seq, line FROM rlm_run_events WHERE run_id = %s ORDER BY seq", (run_id,))
        events = await cur.fetchall()
        cur = await conn.execute(
            "SELECT summary, lm_called, next_seq, attempt FROM rlm_runs WHERE run_id = %s", (run_id,)
        )
        record = await cur.fetchone()
    assert [e["seq"] for e in events] == list(range(len(events)))
    return [json.loads(e["line"])["iteration"] for e in events], record


async def _flush_all(logs: list[PgRunLog], **kw: Any) -> list[bool]:
    answers: dict[int, bool] = {}

    async def one(i: int, log: PgRunLog) -> None:
        summary = kw.get("summary")
        answers[i] = await log.flush(**{**kw, "summary": summary(log.run_id) if summary else None})

    async with anyio.create_task_group() as tg:
        for i, log in enumerate(logs):
            tg.start_soon(one, i, log)
    return [answers[i] for i in range(len(logs))]


async def test_the_flushes_of_several_runs_go_in_one_statement_each_with_its_answer_and_notify(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        _, runs, *_, rows = await _claimed_runs(stores, settings, 3)
        logs = [runs.reopen_claimed(row) for row in rows]
        for k, log in enumerate(logs):
            for n in range(k + 2):
                log.stage(_turn(log.run_id, n))
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as listener:
            for log in logs:
                await listener.execute(f"LISTEN {run_channel(log.run_id)}")
            with _statements(monkeypatch) as seen:
                answers = await _flush_all(logs, summary=lambda r: _live(r, 3), announce=True)
            notices = []
            async for notice in listener.notifies(timeout=30, stop_after=3):
                notices.append(notice)
        assert answers == [True, True, True]
        assert seen.batches == [[log.run_id for log in logs]]  # one statement for the three
        assert sorted(n.channel for n in notices) == sorted(run_channel(log.run_id) for log in logs)
        for notice in notices:
            run_id, live = decode_announcement(notice.payload)
            assert run_channel(run_id) == notice.channel and live is not None and live.iterations == 3
        for k, log in enumerate(logs):
            iterations, record = await _events(pg_url, log.run_id)
            assert iterations == list(range(k + 2)) and log.staged == 0
            assert record is not None and record["next_seq"] == k + 2
            assert json.loads(record["summary"])["iterations"] == 3


async def test_a_flush_asked_while_a_write_is_in_flight_joins_the_next_one(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: the first flush is written at once; the two asked while it is in flight go
    together in the next statement, sent as soon as the first one is answered."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        _, runs, *_, rows = await _claimed_runs(stores, settings, 3)
        logs = [runs.reopen_claimed(row) for row in rows]
        for log in logs:
            log.stage(_turn(log.run_id, 0))
        answers: list[bool] = []
        with _statements(monkeypatch) as seen:
            release = seen.held = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _append(answers, logs[0].flush()))
                await seen.sent.wait()  # the first write is in flight, held
                tg.start_soon(lambda: _append(answers, logs[1].flush()))
                tg.start_soon(lambda: _append(answers, logs[2].flush()))
                await wait_all_tasks_blocked()
                assert len(seen.batches) == 1
                release.set()
        assert seen.batches == [[logs[0].run_id], [logs[1].run_id, logs[2].run_id]]
        assert answers == [True, True, True]
        for log in logs:
            assert (await _events(pg_url, log.run_id))[0] == [0]


async def _append(answers: list[bool], flush: Any) -> None:
    answers.append(await flush)


async def test_a_former_attempts_flush_in_a_batch_lands_nothing_and_the_others_land(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fencing per run in one statement: the run given back and claimed again (attempt 2) takes
    nothing from its former attempt's flush (no row, no summary, the answer False), while the
    new attempt's flush and another run's, in the same statement, are written."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        _, runs, queue, worker, rows = await _claimed_runs(stores, settings, 2)
        stale = runs.reopen_claimed(rows[0])
        stale.stage(_turn(rows[0].run_id, 7))
        assert await queue.requeue(rows[0].run_id, 1, run_record(rows[0].run_id, {"status": "queued", "owner": ALICE}))
        again = await queue.claim(worker, 4, 4)
        assert again is not None and again.attempt == 2
        fresh, other = runs.reopen_claimed(again), runs.reopen_claimed(rows[1])
        fresh.stage(_turn(again.run_id, 1))
        other.stage(_turn(other.run_id, 1))
        with _statements(monkeypatch) as seen:
            answers = await _flush_all([stale, fresh, other], summary=lambda r: _live(r, 5), announce=True)
        assert len(seen.batches) == 1 and len(seen.batches[0]) == 3  # the same run twice: two attempts
        assert answers == [False, True, True]
        iterations, record = await _events(pg_url, again.run_id)
        assert iterations == [1] and record is not None and record["attempt"] == 2
        assert json.loads(record["summary"])["iterations"] == 5  # the new attempt's, not overwritten
        assert (await _events(pg_url, other.run_id))[0] == [1]


async def test_a_pruned_run_in_a_batch_fails_nobody_else(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose record is gone writes nothing (its answer False, its rows dropped: nothing to
    add them to); the other runs of the same statement are written, and no statement failed."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        db, runs, *_, rows = await _claimed_runs(stores, settings, 2)
        gone, kept = runs.reopen_claimed(rows[0]), runs.reopen_claimed(rows[1])
        for log in (gone, kept):
            log.stage(_turn(log.run_id, 0))
        async with db.connection() as conn:
            await conn.execute("DELETE FROM rlm_runs WHERE run_id = %s", (gone.run_id,))
        with _statements(monkeypatch) as seen:
            answers = await _flush_all([gone, kept], summary=lambda r: _live(r, 1), mark_lm_called=True)
        assert seen.batches == [[gone.run_id, kept.run_id]]  # one statement, not retried run by run
        assert answers == [False, True] and gone.staged == 0
        iterations, record = await _events(pg_url, kept.run_id)
        assert iterations == [0] and record is not None and record["lm_called"]


async def test_a_failed_statement_keeps_every_runs_rows_staged_in_order(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each caller of a failed batch gets the failure; every run's rows stay staged, and the next
    flush writes them with what was staged after, in order, no row twice."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        _, runs, *_, rows = await _claimed_runs(stores, settings, 2)
        logs = [runs.reopen_claimed(row) for row in rows]
        for log in logs:
            log.stage(_turn(log.run_id, 0))
            log.stage(_turn(log.run_id, 1))
        failures: list[BaseException] = []

        async def failing(log: PgRunLog) -> None:
            try:
                await log.flush()
            except DatabaseUnavailableError as exc:
                failures.append(exc)

        with _statements(monkeypatch) as seen:
            seen.fail = True
            async with anyio.create_task_group() as tg:
                for log in logs:
                    tg.start_soon(failing, log)
            assert len(seen.batches) == 1 and len(failures) == 2
            assert [log.staged for log in logs] == [2, 2]
            for log in logs:
                log.stage(_turn(log.run_id, 2))
            assert await _flush_all(logs) == [True, True]
        assert len(seen.batches) == 2
        for log in logs:
            assert (await _events(pg_url, log.run_id))[0] == [0, 1, 2] and log.staged == 0


async def test_the_first_answered_calls_mark_joins_the_next_write_and_waits_for_no_tick(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark asked while another run's write is in flight goes in the write right after it,
    and `append` returns once it is written: no tick is waited for on the way."""
    settings = make_settings(tmp_path, database_url=pg_url)

    def no_tick(*args: object, **kw: object) -> float:
        raise AssertionError("the mark waited for a tick")

    async with make_stores(settings) as stores:
        _, runs, *_, rows = await _claimed_runs(stores, settings, 2)
        busy = runs.reopen_claimed(rows[0])
        busy.stage(_turn(busy.run_id, 0))
        marked = QueueRunLog(runs.reopen_claimed(rows[1]))
        monkeypatch.setattr(ticks, "until_tick", no_tick)
        monkeypatch.setattr(ticks, "next_tick", no_tick)
        call = LLMCall(
            run_id=marked.run_id, role="root", model="m", prompt_tokens=1, completion_tokens=1, latency_s=0.01,
            status="ok", finish_reason="stop", error=None, depth=0, iteration=0,
        )  # fmt: skip
        with _statements(monkeypatch) as seen:
            release = seen.held = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(busy.flush)
                await seen.sent.wait()
                tg.start_soon(marked.append, call)
                await wait_all_tasks_blocked()
                release.set()
        assert seen.batches == [[busy.run_id], [marked.run_id]]
        assert marked.must_stop is None and not marked.unrecorded
        iterations, record = await _events(pg_url, marked.run_id)
        assert iterations == [0] and record is not None and record["lm_called"]


async def test_a_flush_the_driver_cannot_send_fails_alone(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose summary cannot be encoded (a lone surrogate) fails its own flush, rows kept;
    the other run of the same batch is written (each flush is then written on its own)."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        _, runs, *_, rows = await _claimed_runs(stores, settings, 2)
        bad, good = runs.reopen_claimed(rows[0]), runs.reopen_claimed(rows[1])
        for log in (bad, good):
            log.stage(_turn(log.run_id, 0))
        unsendable = run_record(bad.run_id, {"status": "running", "iterations": 1, "owner": ALICE, "query": "\udc80"})
        outcomes: dict[str, object] = {}

        async def one(log: PgRunLog, summary: Any) -> None:
            try:
                outcomes[log.run_id] = await log.flush(summary=summary)
            except UnicodeError as exc:
                outcomes[log.run_id] = exc

        with _statements(monkeypatch) as seen:
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, bad, unsendable)
                tg.start_soon(one, good, _live(good.run_id, 1))
        assert seen.batches[0] == [bad.run_id, good.run_id]
        assert isinstance(outcomes[bad.run_id], UnicodeError) and bad.staged == 1
        assert outcomes[good.run_id] is True and good.staged == 0
        assert (await _events(pg_url, good.run_id))[0] == [0]


async def test_a_leader_cancelled_during_its_write_leaves_the_others_to_the_next_one(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller whose write is in flight is cancelled: its rows stay staged, and the other
    flush of its batch is written by the next statement, without being asked again."""
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        _, runs, *_, rows = await _claimed_runs(stores, settings, 2)
        first, second = runs.reopen_claimed(rows[0]), runs.reopen_claimed(rows[1])
        for log in (first, second):
            log.stage(_turn(log.run_id, 0))
        scope = anyio.CancelScope()
        answers: list[bool] = []

        async def cancelled() -> None:
            with scope:
                await first.flush()

        with _statements(monkeypatch) as seen:
            seen.held = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancelled)
                tg.start_soon(lambda: _append(answers, second.flush()))
                await seen.sent.wait()
                scope.cancel()
        assert seen.batches == [[first.run_id, second.run_id], [second.run_id]]
        assert answers == [True] and first.staged == 1 and second.staged == 0
        assert (await _events(pg_url, second.run_id))[0] == [0]
