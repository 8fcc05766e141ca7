"""Turning a run's event log into other shapes: chat-format conversations (for fine-tuning
sets) and a self-contained HTML page to read a trajectory in a browser."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from typing import Any


def conversations(events: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Each run of the tree (the root and every child) as its chat messages, in order."""
    by_run: dict[str, list[dict[str, str]]] = {}
    for event in events:
        if event.get("type") == "turn":
            messages = by_run.setdefault(str(event.get("run_id")), [])
            for message in event.get("new_messages") or []:
                messages.append({"role": str(message.get("role")), "content": str(message.get("content"))})
    return by_run


def chat_jsonl(summary: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """One JSON line per run of the tree: {"messages", "run_id", "status", "answer"}."""
    ends = {str(e.get("run_id")): e for e in events if e.get("type") == "run_end"}
    lines = []
    for run_id, messages in conversations(events).items():
        end = ends.get(run_id, {})
        record = {"run_id": run_id, "status": end.get("status"), "messages": messages}
        if run_id == summary.get("run_id"):
            record["answer"] = (summary.get("result") or {}).get("answer")
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + ("\n" if lines else "")


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1d1d1f}
h1{font-size:1.3rem} .meta{color:#555} pre{white-space:pre-wrap;word-break:break-word;margin:.3rem 0}
.msg{border-left:4px solid #ccc;padding:.2rem .8rem;margin:.6rem 0;background:#fafafa}
.system{border-color:#999}.user{border-color:#3a7bd5}.assistant{border-color:#2e9d5b}
.cell{border:1px solid #ddd;border-radius:6px;padding:.4rem .8rem;margin:.6rem 0}
.err{color:#b00020} .role{font-weight:600;font-size:.8rem;text-transform:uppercase;color:#666}
details summary{cursor:pointer;color:#555}
"""


def _pre(text: Any) -> str:
    return f"<pre>{html.escape(str(text))}</pre>"


def render_html(summary: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """A page with no external resources: every string from the log is escaped."""
    result = summary.get("result") or {}
    usage = (result.get("usage") or summary.get("usage") or {}).get("total", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>rlm-mcp run {html.escape(str(summary.get('run_id')))}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(str(summary.get('query', '')))}</h1>",
        "<p class='meta'>"
        + " · ".join(
            html.escape(str(x))
            for x in (
                summary.get("run_id"),
                f"status {result.get('status') or summary.get('status')}",
                f"{result.get('iterations', summary.get('iterations', 0))} turns",
                f"{result.get('sub_calls', summary.get('sub_calls', 0))} sub-calls",
                f"{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens",
                f"{result.get('duration_s', '?')} s",
            )
        )
        + "</p>",
    ]
    if result.get("reason"):
        parts.append(f"<p class='err'>{html.escape(str(result['reason']))}</p>")
    parts.append("<h2>Answer</h2>" + _pre(result.get("answer")))
    # A turn's cells and sub-calls are logged before its `turn` event (which carries the
    # messages), so hold them and show them right after the reply that ran them.
    pending: list[str] = []
    for event in events:
        kind = event.get("type")
        if kind == "turn_start":
            depth = event.get("depth", 0)
            label = f"Turn {event.get('iteration')}" + (f" · child run at depth {depth}" if depth else "")
            parts.append(f"<h3>{html.escape(label)}</h3>")
        elif kind == "turn":
            for message in event.get("new_messages") or []:
                role = html.escape(str(message.get("role")))
                body = _pre(message.get("content"))
                if role == "system":
                    body = f"<details><summary>system prompt</summary>{body}</details>"
                parts.append(f"<div class='msg {role}'><div class='role'>{role}</div>{body}</div>")
                if role == "assistant":
                    parts.extend(pending)
                    pending = []
            parts.extend(pending)
            pending = []
        elif kind == "cell":
            error = f"<div class='err'>{html.escape(str(event['error']))}</div>" if event.get("error") else ""
            pending.append(
                f"<div class='cell'><div class='role'>cell {html.escape(str(event.get('block')))} · "
                f"{html.escape(str(event.get('duration_s')))} s</div>{_pre(event.get('code'))}"
                f"<details><summary>output</summary>{_pre(event.get('output'))}</details>{error}</div>"
            )
        elif kind == "sub_calls":
            pending.append(
                f"<p class='meta'>{html.escape(str(event.get('count')))} {html.escape(str(event.get('kind')))} "
                f"sub-calls, {html.escape(str(event.get('failed')))} failed</p>"
            )
    parts.extend(pending)
    parts.append("</body></html>")
    return "\n".join(parts)
