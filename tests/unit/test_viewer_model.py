"""The viewer's model of a run log, and the page's data channel, without a browser."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
from hypothesis import given
from hypothesis import strategies as st

from rlm_mcp.events import SubCalls
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store import RunStore
from rlm_mcp.viewer.model import build_run
from rlm_mcp.viewer.page import json_for_script, render_page
from tests.fixtures_engine import make_settings
from tests.fixtures_viewer import HOSTILE, record_run


def _load(tmp_path: Path) -> tuple[RunRecord, list]:
    async def work() -> tuple[RunRecord, list]:
        await record_run(tmp_path / "data")
        store = RunStore(make_settings(data_dir=tmp_path / "data"))
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
