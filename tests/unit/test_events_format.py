"""The run log's format on disk: logs written before events were typed (tests/data/runlog_v0,
recorded by the code of 822c879) read back as typed events, encode to the same bytes, and give
the same viewer model, chat export and `rlm-mcp runs export` lines as that code made of them;
logs written now have the same shape."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_mcp import events as ev
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store import RunStore
from rlm_mcp.store.event_lines import encode_event
from rlm_mcp.viewer.export import chat_jsonl
from rlm_mcp.viewer.model import build_run
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.fixtures_engine import make_settings
from tests.fixtures_viewer import record_run
from tests.paths import TESTS

V0 = TESTS / "data" / "runlog_v0"
RUNS = ("run_fixture_full", "run_fixture_capped")


def _lines(run_id: str) -> list[bytes]:
    return (V0 / run_id / "events.jsonl").read_bytes().splitlines()


def _read(tmp_path: Path, run_id: str) -> tuple[RunRecord, list[ev.LoggedEvent]]:
    data = tmp_path / "data"
    shutil.copytree(V0 / run_id, data / "runs" / run_id)
    store = RunStore(make_settings(data_dir=data).store)

    async def work() -> tuple[RunRecord, list[ev.LoggedEvent]]:
        return await store.read_summary(run_id, owner=EVERY_OWNER), await store.read_events(run_id, owner=EVERY_OWNER)

    return anyio.run(work)


@pytest.mark.parametrize("run_id", RUNS)
def test_every_old_line_is_a_typed_event_that_encodes_to_the_same_bytes(run_id: str) -> None:
    for line in _lines(run_id):
        event = ev.loads(line)
        assert not isinstance(event, ev.UnreadableEvent), line
        assert ev.dumps(event).encode() == line


def test_the_old_logs_hold_every_kind() -> None:
    kinds = {type(ev.loads(line)) for run_id in RUNS for line in _lines(run_id)}
    assert kinds == {
        ev.RunStart,
        ev.TurnStart,
        ev.HistoryElided,
        ev.LLMCall,
        ev.CellStart,
        ev.SubCalls,
        ev.ChildStart,
        ev.ChildEnd,
        ev.Cell,
        ev.Turn,
        ev.RunEnd,
        ev.LogTruncated,
        ev.EventStub,
    }


@pytest.mark.parametrize("run_id", RUNS)
def test_old_logs_give_the_same_view_and_chat_export(tmp_path: Path, run_id: str) -> None:
    summary, events = _read(tmp_path, run_id)
    expected = json.loads((V0 / run_id / "expected_view.json").read_text(encoding="utf-8"))
    chat = (V0 / run_id / "expected_chat.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    # The view names the kept session a run belongs to (added with kept sessions, after these logs
    # were recorded): a run of that time belongs to none.
    expected["session_id"] = None
    if run_id == "run_fixture_capped":
        # The old code filed the stub of a too-large `turn` event under a run named "None" (its
        # handlers read the missing run_id as None): an empty run in the view and an empty
        # conversation in the export. Typed, the stub is no turn; the page says what happened.
        del expected["runs"]["None"]
        expected["notes"].insert(0, "A turn event was too large to record; only its time was kept.")
        assert chat[0] == '{"run_id": "None", "status": null, "messages": []}\n'
        del chat[0]
    view = json.loads(json.dumps(build_run(summary, events)))
    # The view sums each run's LM waits (added with back-pressure, after these logs were recorded):
    # their calls logged none, so every sum but the count of calls is zero.
    for waits in [view.pop("lm_waits"), *(run.pop("lm_waits") for run in view["runs"].values())]:
        assert {k: v for k, v in waits.items() if k != "calls"} == dict.fromkeys(
            ("queued_s", "retried", "retries", "throttled", "backoff_s"), 0
        )
    assert view == expected
    assert chat_jsonl(summary, events) == "".join(chat)


@pytest.mark.parametrize("run_id", RUNS)
def test_runs_export_prints_the_same_lines(tmp_path: Path, run_id: str) -> None:
    shutil.copytree(V0 / run_id, tmp_path / "data" / "runs" / run_id)
    proc = subprocess.run(
        [str(SERVER_SCRIPT), "runs", "export", run_id],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (V0 / run_id / "expected_export.jsonl").read_text(encoding="utf-8")


def test_logs_written_now_have_the_old_shape(tmp_path: Path) -> None:
    """Same scenario as run_fixture_full, recorded by today's engine: the same events, each with
    the same keys in the same order (times, latencies and the order of concurrent sub-calls vary)."""
    run_dir = anyio.run(lambda: record_run(tmp_path / "data", run_id="run_fixture_full", log_sub_call_chars=120))

    def shapes(lines: list[bytes]) -> Counter[tuple[str, ...]]:
        return Counter(tuple(json.loads(line)) for line in lines)

    assert shapes((run_dir / "events.jsonl").read_bytes().splitlines()) == shapes(_lines("run_fixture_full"))


@pytest.mark.parametrize("run_id", RUNS)
def test_a_store_can_keep_events_as_lines(run_id: str) -> None:
    """What a store that keeps lines elsewhere (a database) relies on: dumps/loads round-trip."""
    for line in _lines(run_id):
        event = ev.loads(line)
        assert ev.loads(ev.dumps(event)) == event


def test_fields_of_a_newer_version_are_kept() -> None:
    line = {"type": "cell_start", "run_id": "r", "iteration": 1, "block": 2, "depth": 0, "ts": 1.5, "gpu": "h100"}
    event = ev.from_json(line)
    assert isinstance(event, ev.CellStart) and event.block == 2
    assert ev.to_json(event) == line


def test_events_from_before_the_sub_call_records_still_read() -> None:
    """Logs written before sub-calls named their cell and batch (before c82e289) lack those fields."""
    old = [
        {"type": "child_start", "child_run_id": "r.1", "depth": 1, "status": "running", "ts": 2.0},
        {"type": "child_end", "child_run_id": "r.1", "depth": 1, "status": "completed", "ts": 3.0},
        {
            "type": "llm_call",
            "run_id": "r",
            "role": "sub",
            "model": "m",
            "prompt_tokens": 1,
            "completion_tokens": 2,
            "latency_s": 0.1,
            "status": "ok",
            "finish_reason": "stop",
            "error": None,
            "depth": 1,
            "ts": 2.5,
        },
    ]
    events = [ev.from_json(e) for e in old]
    assert [type(e) for e in events] == [ev.ChildStart, ev.ChildEnd, ev.LLMCall]
    assert [ev.to_json(e) for e in events] == old
    model = build_run(RunRecord.from_stored({"run_id": "r"}), events)
    assert model["runs"]["r"]["children"] == ["r.1"] and model["runs"]["r.1"]["parent"] == "r"
    assert model["runs"]["r.1"]["status"] == "completed"


@settings(max_examples=60, deadline=None)
@given(code=st.text(), output=st.text(), max_bytes=st.integers(min_value=80, max_value=4096))
def test_a_capped_line_reads_back_as_its_event_or_its_stub(code: str, output: str, max_bytes: int) -> None:
    """The log's caps cut strings or reduce a line to its kind and time: either way the line
    still reads back as a typed event (never an unreadable one)."""
    cell = ev.Cell(
        run_id="r",
        iteration=1,
        block=1,
        code=code,
        output=output,
        duration_s=0.25,
        error=None,
        timed_out=False,
        restarted=False,
        depth=0,
    )
    try:
        line = encode_event(ev.to_json(cell, ts=1.5), max_bytes)
    except UnicodeEncodeError:  # a lone surrogate cannot be written as UTF-8 (the log skips the event)
        return
    back = ev.loads(line)
    assert isinstance(back, (ev.Cell, ev.EventStub)) and back.ts == 1.5
    if isinstance(back, ev.Cell):
        assert back.code == code[: len(back.code)] or "truncated" in back.code
        assert ev.dumps(back).encode() + b"\n" == line
