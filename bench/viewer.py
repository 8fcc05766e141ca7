"""Viewer benchmark: a 20-turn run with 2,000 sub-calls (the real engine with a scripted model
and in-process sandbox, written through the real RunStore), turned into a page and loaded in
headless Chromium.

    .venv/bin/python bench/viewer.py

Prints the log and page sizes, the time to build the view model and the page, the time until
Chromium has drawn every turn, and the time to open one batch of 100 sub-calls. Never fails on
a timing.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import anyio

from rlm_mcp.events import LoggedEvent
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.runs import RunRecord

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: tests.* helpers

from rlm_mcp.store import RunStore
from rlm_mcp.viewer import render_run_html
from rlm_mcp.viewer.model import build_run
from tests.chromium import Browser
from tests.fixtures_engine import make_settings
from tests.fixtures_viewer import record_big_run


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        run_dir = anyio.run(record_big_run, data)
        store = RunStore(make_settings(data_dir=data).store)

        async def load() -> tuple[RunRecord, list[LoggedEvent]]:
            return await store.read_summary("run_big", owner=EVERY_OWNER), await store.read_events(
                "run_big", owner=EVERY_OWNER
            )

        started = time.perf_counter()
        summary, events = anyio.run(load)
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        build_run(summary, events)
        model_s = time.perf_counter() - started
        started = time.perf_counter()
        page = render_run_html(summary, events)
        page_s = time.perf_counter() - started
        out = Path(tmp) / "big.html"
        out.write_text(page, encoding="utf-8")
        print(
            f"log: {(run_dir / 'events.jsonl').stat().st_size / 1e6:.1f} MB, {len(events)} events; "
            f"page: {len(page.encode()) / 1e6:.1f} MB"
        )
        print(f"read log {read_s * 1000:.0f} ms, view model {model_s * 1000:.0f} ms, page {page_s * 1000:.0f} ms")
        browser = Browser()
        try:
            started = time.perf_counter()
            browser.open(
                out.as_uri(), ready="document.querySelectorAll('main > .runbody > section.turn').length === 20"
            )
            print(f"Chromium: all 20 turns drawn {(time.perf_counter() - started) * 1000:.0f} ms after navigation")
            started = time.perf_counter()
            browser.eval("document.querySelector('section.turn[data-turn=\"7\"] details.batch').open = true")
            browser.wait_for("document.querySelectorAll('section.turn[data-turn=\"7\"] details.call').length === 100")
            print(f"Chromium: one batch of 100 sub-calls opened in {(time.perf_counter() - started) * 1000:.0f} ms")
        finally:
            browser.close()


if __name__ == "__main__":
    main()
