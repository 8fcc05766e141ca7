"""Throttling where a user looks: a run whose sub-calls met a 429 storm logs, per LM call, the
retries, the 429s and the sleeps (each answer 429 accounted on the call that got it), the run's
view model sums them; `/runs/api/throttles` shows each endpoint's limit and its cuts. A log
written before these fields reads as a run without waits."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rlm_mcp.access import HostPolicy
from rlm_mcp.events import LLMCall, from_json, to_json
from rlm_mcp.lm.throttle import Throttles
from rlm_mcp.lm.throttle_board import MAX_NOTE_CHARS, STALE_S, ThrottleBoard, note_of
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.store import RunStore
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.viewer.auth import COOKIE, ViewerAuth
from rlm_mcp.viewer.model import build_run
from rlm_mcp.viewer.routes import build_viewer
from tests.fixtures_store import run_record
from tests.fixtures_throttle import throttled_run

pytestmark = pytest.mark.anyio


async def test_a_runs_page_model_counts_its_calls_429s_and_backoff(tmp_path: Path) -> None:
    state, events = await throttled_run(tmp_path)
    calls = [e for e in events if isinstance(e, LLMCall)]
    assert len(calls) == state.answered == 2 + 32 and state.refused > 0
    # Every 429 is accounted on the call that got it, and waited out in a retry.
    assert sum(c.throttled or 0 for c in calls) == state.refused
    retried = [c for c in calls if c.retries]
    assert retried and all((c.retries or 0) >= (c.throttled or 0) > 0 and (c.backoff_s or 0) > 0 for c in retried)
    assert all(c.retries is None and c.backoff_s is None for c in calls if not c.throttled)
    model = build_run(run_record("run_t", {"request": {"query": "Count the parts."}}), events)
    waits = model["lm_waits"]
    assert waits["calls"] == 34 and waits["throttled"] == state.refused and waits["retried"] == len(retried)
    assert waits["backoff_s"] == pytest.approx(sum(c.backoff_s or 0 for c in calls), abs=0.01)
    # ... and each call shows its own (the batch's calls on the run page).
    root = model["runs"]["run_t"]
    shown = [c for t in root["turns"] for cell in t["cells"] for b in cell["batches"] for c in b["calls"]]
    assert sum(c.get("throttled", 0) for c in shown) == state.refused


def test_an_older_logs_calls_read_as_calls_without_waits() -> None:
    old = {"type": "llm_call", "run_id": "r", "role": "root", "model": "m", "prompt_tokens": 1}
    old |= {"completion_tokens": 1, "latency_s": 0.1, "status": "ok", "finish_reason": "stop", "error": None}
    event = from_json({**old, "depth": 0, "iteration": 1, "ts": 1.0})
    assert isinstance(event, LLMCall) and event.retries is None and event.queued_s is None
    model = build_run(run_record("r"), [event])
    assert model["lm_waits"] == {"calls": 1, "queued_s": 0, "retried": 0, "retries": 0, "throttled": 0, "backoff_s": 0}
    (call,) = model["runs"]["r"]["turns"][0]["root_calls"]
    assert "retries" not in call and "queued_s" not in call
    # Written without waits, the event carries none of the new fields (the log does not grow).
    assert to_json(event) == {**old, "depth": 0, "iteration": 1, "ts": 1.0}


async def test_the_throttle_api_shows_each_endpoints_limit_and_cuts(tmp_path: Path) -> None:
    throttles = Throttles(16, queueing_cut=2.0)
    gate = throttles.gate("sub", "http://lm:8000/v1", "small")
    sent = await gate.acquire()
    gate.release()
    assert gate.throttled(429, sent)

    async def states() -> list[dict[str, object]]:
        return throttles.states()

    store = RunStore(make_settings(tmp_path).store)
    auth = ViewerAuth(tokens=["t"], policy=HostPolicy("127.0.0.1", 80, [], []))
    session = await auth.redeem(auth.issue_code(EVERY_OWNER))
    assert session is not None
    transport = httpx.ASGITransport(app=build_viewer(store, auth, throttles=states))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        refused = await client.get("/runs/api/throttles")
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", cookies={COOKIE: session}) as client:
        shown = await client.get("/runs/api/throttles")
    assert refused.status_code == 401
    assert shown.status_code == 200, shown.text
    (row,) = shown.json()["data"]
    assert row == {
        "endpoint": "sub",
        "url": "http://lm:8000/v1",
        "model": "small",
        "limit": 8,
        "ceiling": 16,
        "in_flight": 0,
        "waiting": 0,
        "throttled": 1,
        "cuts": 1,
        "queueing_cuts": 0,
        "latency_ratio": None,
    }


def test_the_board_forgets_a_silent_worker_and_keeps_notes_within_notify() -> None:
    now = [100.0]
    board = ThrottleBoard(clock=lambda: now[0])
    gate = {"endpoint": "root", "model": "m", "limit": 3}
    board.on_note(note_of("w1", [gate]))
    board.on_note("not json")
    board.on_note('{"from": 1, "gates": []}')
    assert board.states() == [{**gate, "process": "w1"}]
    now[0] += STALE_S + 1
    assert board.states() == []
    many = [{"endpoint": "root", "model": "m" * 100, "n": i} for i in range(200)]
    note = note_of("w2", many)
    assert len(note) <= MAX_NOTE_CHARS + 64 and 0 < len(json.loads(note)["gates"]) < 200
