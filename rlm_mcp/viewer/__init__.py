"""The trajectory viewer: static pages (`rlm-mcp runs html`), the live pages under `/runs/`
of the HTTP server, and `rlm-mcp runs view`."""

from __future__ import annotations

from rlm_mcp.events import LoggedEvent
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.viewer.chain import build_session, session_runs
from rlm_mcp.viewer.model import build_run, index_entry
from rlm_mcp.viewer.page import render_page


def render_run_html(record: RunRecord, events: list[LoggedEvent]) -> str:
    """A self-contained page of one run (no network, nothing executable from the log)."""
    return render_page("run", build_run(record, events), title=f"rlm-mcp run {record.run_id}")


def render_index_html(records: list[RunRecord], *, run_href: str = "") -> str:
    """A self-contained runs index; each row links to `run_href + run_id`."""
    return render_page("index", [index_entry(r) for r in records], title="rlm-mcp runs", run_href=run_href)


def render_session_html(session_id: str, records: list[RunRecord]) -> str:
    """A self-contained page of a kept session: its runs among `records`, as a chain."""
    model = build_session(session_id, session_runs(records, session_id))
    return render_page("session", model, title=f"rlm-mcp session {session_id}")


__all__ = ["render_index_html", "render_run_html", "render_session_html"]
