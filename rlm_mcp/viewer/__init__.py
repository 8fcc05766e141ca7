"""The trajectory viewer: static pages (`rlm-mcp runs html`), the live pages under `/runs/`
of the HTTP server, and `rlm-mcp runs view`."""

from __future__ import annotations

from rlm_mcp.events import LoggedEvent
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.viewer.model import build_run, index_entry
from rlm_mcp.viewer.page import render_page


def render_run_html(record: RunRecord, events: list[LoggedEvent]) -> str:
    """A self-contained page of one run (no network, nothing executable from the log)."""
    return render_page("run", build_run(record, events), title=f"rlm-mcp run {record.run_id}")


def render_index_html(records: list[RunRecord], *, run_href: str = "") -> str:
    """A self-contained runs index; each row links to `run_href + run_id`."""
    return render_page("index", [index_entry(r) for r in records], title="rlm-mcp runs", run_href=run_href)


__all__ = ["render_index_html", "render_run_html"]
