"""The viewer's model of a run log, and the page's data channel, without a browser."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
from hypothesis import given
from hypothesis import strategies as st

from rlm_mcp.events import SubCalls
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.runs import RunRecord, summed_usage
from rlm_mcp.store import RunStore
from rlm_mcp.viewer.chain import EXCERPT_CHARS, build_session, session_runs
from rlm_mcp.viewer.model import build_run
from rlm_mcp.viewer.page import json_for_script, render_page
from tests.fixtures_engine import make_settings
from tests.fixtures_store import run_record
from tests.fixtures_viewer import HOSTILE, record_run


def _load(tmp_path: Path) -> tuple[RunRecord, list]:
    async def work() -> tuple[RunRecord, list]:
        await record_run(tmp_path / "data")
        store = RunStore(make_settings(data_dir=tmp_path / "data").store)
        return await store.read_summary("run_viewer_1", owner=EVERY_OWNER), await store.read_events(
            "run_viewer_1", owner=EVERY_OWNER
        )

    return anyio.run(work)


def test_model_ties_calls_to_batches_cells_and_children(tmp_path: Path) -> None:
    summary, events = _load(tmp_path)
    model = build_run(summary, events)
    assert model["finished"] and model["status"] == "completed" and model["answer"] == "final: " + HOSTILE
    root = model["runs"]["run_viewer_1"]
    assert [t["iteration"] for t in root["turns"]] == [1, 2, 3, 4, 5]
    cell = root["turns"][0]["cells"][0]
    (batch,) = cell["batches"]
    assert [c["prompt"] for c in batch["calls"]] == ["summarise part one", HOSTILE, "fail this one"]
    assert batch["count"] == 3 and batch["failed"] == 1 and batch["start"] <= batch["end"]
    assert cell["start"] <= batch["start"] and batch["end"] <= cell["end"]
    (child_id,) = root["turns"][3]["cells"][0]["children"]
    child = model["runs"][child_id]
    assert child["parent"] == "run_viewer_1" and child["answer"] == "child says: the child task"
    assert child["turns"] and child["status"] == "completed"
    assert root["turns"][2]["cells"][0]["restarted"] and root["turns"][1]["cells"][0]["error"]
    # every turn names the root window it used
    assert all(t["root_calls"][0]["prompt_tokens"] > 0 for t in root["turns"])


def test_a_log_cut_mid_cell_is_a_running_run(tmp_path: Path) -> None:
    summary, events = _load(tmp_path)
    cut = next(i for i, e in enumerate(events) if isinstance(e, SubCalls))
    model = build_run(RunRecord.from_stored({"run_id": summary.run_id, "query": summary.request.query}), events[:cut])
    assert not model["finished"] and model["status"] == "running" and model["answer"] is None
    cell = model["runs"]["run_viewer_1"]["turns"][0]["cells"][0]
    assert cell["end"] is None and cell["batches"][0]["end"] is None and len(cell["batches"][0]["calls"]) == 3


@given(st.text())
def test_script_data_is_inert_and_round_trips(text: str) -> None:
    encoded = json_for_script({"t": text})
    assert "<" not in encoded and ">" not in encoded and "&" not in encoded
    assert json.loads(encoded) == {"t": text}


def test_page_has_no_raw_run_text() -> None:
    page = render_page("run", {"query": HOSTILE}, title=HOSTILE)
    assert HOSTILE not in page and page.count("<script") == 2 and "Content-Security-Policy" in page


def _session_run(run_id: str, created_at: float, contexts: list[str], **result: object) -> RunRecord:
    """A run of session ses_a with one LM call (priced, but for run_c's) and `result`'s fields."""
    count: dict[str, object] = {"prompt_tokens": 100, "completion_tokens": 10, "calls": 1}
    if run_id != "run_c":  # one run's model has no price: the session's cost is the priced runs'
        count["cost_usd"] = 0.25
    done = {"status": "completed", "answer": f"answer of {run_id}", "iterations": 2}
    done |= {"usage": {"by_model": {"m": count}}} | result
    stored = {"query": f"Q {run_id}", "session_id": "ses_a", "context_ids": contexts, "result": done}
    if run_id == "run_n":
        stored["not_started"] = {"cause": "no sandbox slot came free"}
    return run_record(run_id, stored, created_at=created_at)


def test_a_session_is_a_chain_of_its_runs_in_the_order_they_ran() -> None:
    records = [
        _session_run("run_c", 30.0, []),  # a follow-up without a new context
        _session_run("run_a", 10.0, ["ctx_1"]),
        run_record("run_x", {"query": "elsewhere", "session_id": "ses_b"}, created_at=15.0),
        _session_run("run_b", 20.0, ["ctx_2", "ctx_3"], status="error", answer="x" * 5000),
        _session_run("run_n", 25.0, ["ctx_4"], status="error", answer=None),
    ]
    model = build_session("ses_a", session_runs(records, "ses_a"), {"state": "live", "age_s": 3.0, "runs": ["run_a"]})
    assert [r["run_id"] for r in model["runs"]] == ["run_a", "run_b", "run_n", "run_c"]
    assert [r["step"] for r in model["runs"]] == [1, 2, 3, 4]
    assert [[c["name"] for c in r["contexts"]] for r in model["runs"]] == [
        ["context_0"],
        ["context_1", "context_2"],
        [],  # it never started: it bound nothing
        [],
    ]
    assert model["runs"][1]["contexts"][1]["context_id"] == "ctx_3" and model["contexts_bound"] == 3
    long = model["runs"][1]
    assert long["answer"] == "x" * EXCERPT_CHARS and long["answer_chars"] == 5000 and long["status"] == "error"
    assert model["created_at"] == 10.0 and model["last_run_at"] == 30.0
    assert model["state"] == {"state": "live"}  # what changes by the second is left to the page
    total = model["usage"]["total"]
    assert total["calls"] == 4 and total["prompt_tokens"] == 400 and total["cost_usd"] == 0.75
    assert summed_usage(records[:1]).total.cost_usd is None  # no price, no cost: never a guess
