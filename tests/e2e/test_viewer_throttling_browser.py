"""Throttling in the viewer, in real headless Chromium: the run page of a run whose sub-calls met
a 429 storm says how many calls retried, how many 429s and how long they backed off, and each
call says its own; the runs list draws the LM endpoints' limits panel from `api/throttles`."""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from rlm_mcp.events import LLMCall
from rlm_mcp.viewer import render_index_html, render_run_html
from tests.chromium import Browser
from tests.fixtures_store import run_record
from tests.fixtures_throttle import throttled_run


def test_the_run_page_shows_its_calls_429s_and_backoff(tmp_path: Path, browser: Browser) -> None:
    state, events = anyio.run(throttled_run, tmp_path)
    record = run_record("run_t", {"request": {"query": "Count the parts."}})
    page = tmp_path / "run.html"
    page.write_text(render_run_html(record, events), encoding="utf-8")
    browser.open(page.as_uri(), ready="document.querySelectorAll('.turn').length > 0")
    retried = sum(1 for e in events if isinstance(e, LLMCall) and e.retries)
    line = browser.eval("document.querySelector('p.lmwaits').textContent")
    assert f"{retried} of 34 calls retried" in line and f"{state.refused} answers 429/503" in line, line
    browser.eval("document.querySelector('details.batch').open = true")
    browser.wait_for("document.querySelectorAll('details.call').length === 32")
    metas = browser.eval("[...document.querySelectorAll('details.call > summary .meta')].map(e => e.textContent)")
    assert sum(1 for m in metas if "× 429/503" in m) == sum(
        1 for e in events if isinstance(e, LLMCall) and e.role == "sub" and e.throttled
    )


def test_the_runs_list_draws_the_endpoints_limits(tmp_path: Path, browser: Browser) -> None:
    page = tmp_path / "index.html"
    page.write_text(render_index_html([run_record("run_a", {"request": {"query": "q"}})]), encoding="utf-8")
    browser.open(page.as_uri(), ready="document.querySelectorAll('tr.row').length === 1")
    assert browser.eval("document.querySelector('section.throttles')") is None  # no endpoint called yet
    gate = {"endpoint": "sub", "url": "http://lm/v1", "model": "small", "limit": 4, "ceiling": 16, "in_flight": 4}
    gate |= {"waiting": 12, "throttled": 37, "cuts": 3, "queueing_cuts": 1, "latency_ratio": 1.4}
    # What refreshThrottles does with the api/throttles answer (a file:// page cannot fetch it).
    browser.eval(f"GATES = {json.dumps([gate])}; draw(CONFIG.data)")
    cells = browser.eval("[...document.querySelectorAll('section.throttles tr.gate td')].map(e => e.textContent)")
    assert cells[:6] == ["sub · small", "4 of 16", "4 (+12 waiting)", "37", "3 (1 for latency)", "1.4×"], cells
    assert browser.eval("document.querySelector('section.throttles tr.gate').classList.contains('warn')")
    assert browser.eval("document.querySelectorAll('tr.row').length") == 1  # the runs are still drawn
