"""A run's event log as chat-format conversations (for fine-tuning sets)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rlm_mcp.events import LoggedEvent, RunEnd, Turn
from rlm_mcp.ports.runs import RunRecord


def conversations(events: Iterable[LoggedEvent]) -> dict[str, list[dict[str, str]]]:
    """Each run of the tree (the root and every child) as its chat messages, in order."""
    by_run: dict[str, list[dict[str, str]]] = {}
    for event in events:
        if isinstance(event, Turn):
            messages = by_run.setdefault(event.run_id, [])
            messages.extend({"role": m.role, "content": m.content} for m in event.new_messages)
    return by_run


def chat_jsonl(run: RunRecord, events: list[LoggedEvent]) -> str:
    """One JSON line per run of the tree: {"messages", "run_id", "status", "answer"}."""
    ends = {e.run_id: e for e in events if isinstance(e, RunEnd)}
    lines = []
    for run_id, messages in conversations(events).items():
        end = ends.get(run_id)
        record = {"run_id": run_id, "status": end.status if end is not None else None, "messages": messages}
        if run_id == run.run_id:
            record["answer"] = run.result.answer if run.result is not None else None
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + ("\n" if lines else "")
