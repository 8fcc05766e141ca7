"""Each run log takes an LM call's event as its line's values (`append_call`) as it takes the
event's model (`append`): the file log writes the same line in the same order, a team worker's
log marks the first answered call as before, and a run's events that wait for its record
(`LateRecord`) keep their order."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from rlm_mcp import events as ev
from rlm_mcp.call_lines import CallLine, call_line
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.service.late_start import LateRecord
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.store.runs import RunLog, RunStore
from rlm_mcp.testing.memory_runlog import MemoryRunLog
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_store import run_record

RUN = "run_lines0000000001"
TS = 1795462398.5


def _call(index: int, error: str | None = None) -> CallLine:
    return call_line(
        run_id=RUN, role="sub", model="m", prompt_tokens=3, completion_tokens=1, latency_s=0.01,
        finish_reason=None if error else "stop", error=error, depth=1, iteration=1, block=0, batch=1,
        index=index, prompt=f"q{index} ✓", prompt_chars=4, answer="ok", answer_chars=2,
    )  # fmt: skip


def _turn(n: int) -> ev.TurnStart:
    return ev.TurnStart(run_id=RUN, iteration=n, max_iterations=9, depth=0)


def test_the_file_log_writes_the_models_lines_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: TS)  # the line's stamp
    calls = [_call(0), _call(1, error="refused"), _call(2)]

    async def write(folder: Path, as_lines: bool) -> None:
        log = RunLog(folder, created_at=time.time(), max_event_bytes=1 << 20, max_log_bytes=1 << 30)
        await log.append(_turn(1))
        for call in calls:
            await (log.append_call(call) if as_lines else log.append(call.event()))
        await log.append(_turn(2))
        await log.aclose()

    for name, as_lines in (("lines", True), ("models", False)):
        (tmp_path / name).mkdir()
        anyio.run(write, tmp_path / name, as_lines)
    lines, models = ((tmp_path / name / "events.jsonl").read_bytes() for name in ("lines", "models"))
    assert lines == models
    assert [ev.loads(line).type for line in lines.splitlines()] == ["turn_start", *["llm_call"] * 3, "turn_start"]


def test_the_file_log_cap_counts_call_lines(tmp_path: Path) -> None:
    async def main() -> list[ev.LoggedEvent]:
        log = RunLog(tmp_path, created_at=time.time(), max_event_bytes=1 << 20, max_log_bytes=600)
        for index in range(10):
            await log.append_call(_call(index))
        await log.aclose()
        return [ev.loads(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]

    events = anyio.run(main)
    assert isinstance(events[-1], ev.LogTruncated) and 1 <= len(events) < 10


def test_a_workers_log_marks_the_first_answered_call_as_before() -> None:
    writes: list[tuple[list[str | None], bool]] = []

    def write(rows: list[tuple[int, str]], seq: int, summary: RunRecord | None, mark: bool, announce: bool) -> bool:
        writes.append(([ev.loads(line).type for _, line in rows], mark))
        return True

    async def main() -> QueueRunLog:
        log = QueueRunLog(MemoryRunLog(write, RUN, 0, lambda record: True))
        await log.append(_turn(1))
        await log.append_call(_call(0, error="refused"))  # a failed call: staged like any event
        assert writes == [] and log.staged == 2
        await log.append_call(_call(1))  # the first answered call: written with the mark
        await log.append_call(_call(2))  # later ones are staged
        return log

    log = anyio.run(main)
    assert writes == [(["turn_start", "llm_call", "llm_call"], True)] and log.staged == 1


def test_a_first_answer_the_database_refuses_stops_the_run_whatever_the_error() -> None:
    """Not only the mapped "database unavailable" error: any failure to write the mark (a value
    the driver refuses) leaves the run unrecorded, so its worker stops it before its code runs."""

    def write(rows: list[tuple[int, str]], seq: int, summary: RunRecord | None, mark: bool, announce: bool) -> bool:
        raise ValueError("a value the driver cannot encode")

    async def main() -> QueueRunLog:
        log = QueueRunLog(MemoryRunLog(write, RUN, 0, lambda record: True))
        await log.append(_turn(1))
        await log.append_call(_call(0))  # the first answered call: its mark cannot be written
        return log

    log = anyio.run(main)
    assert log.unrecorded and not log.lm_called


def test_events_waiting_for_the_record_keep_their_order(tmp_path: Path) -> None:
    async def main() -> list[str | None]:
        store = RunStore(make_settings(tmp_path).store)
        late = LateRecord(store, run_record(RUN, {"status": "running"}))
        await late.log.append(_turn(1))
        await late.log.append_call(_call(0))
        await late.log.append(_turn(2))
        log = await late.create()  # the waiting events go to the log, in order
        await late.log.append_call(_call(1))
        await log.aclose()
        return [
            e.type
            for e in [
                ev.loads(line) for line in (tmp_path / "data" / "runs" / RUN / "events.jsonl").read_bytes().splitlines()
            ]
        ]

    assert anyio.run(main) == ["turn_start", "llm_call", "turn_start", "llm_call"]
