"""Turning cell results into the REPL-output text the adapter was trained to read."""

from __future__ import annotations

from typing import Any

from rlm_mcp.ports import CellResult

# Events carry messages and outputs for the trajectory log; cap each text so one huge cell
# cannot bloat the log (the model itself never sees more than `output_chars` per block).
EVENT_TEXT_CAP = 64 * 1024


def truncate_head(text: str, limit: int) -> str:
    """Keep the first `limit` characters and say how many were dropped (trained format)."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"... + [{len(text) - limit} chars...]"


def format_cell(result: CellResult) -> str:
    """One block's output: stdout, stderr (with the exception), host notice, variable names.

    Mirrors the trained layout: each present part starts on a new line and parts are joined by
    blank lines; nothing at all reads "No output".
    """
    parts: list[str] = []
    if result.stdout:
        parts.append("\n" + result.stdout)
    stderr = result.stderr
    # The sandbox may or may not have written the exception to stderr already; show it once.
    if result.error and result.error.strip() not in stderr:
        stderr = (stderr.rstrip("\n") + "\n" + result.error) if stderr else result.error
    if stderr:
        parts.append("\n" + stderr)
    if result.notice:
        parts.append("\n" + result.notice)
    if result.variables:
        parts.append(f"REPL variables: {list(result.variables)!r}\n")
    return "\n\n".join(parts) if parts else "No output"


def format_outputs(blocks: list[str], output_chars: int) -> str:
    """The single user message carrying every block's output of one reply."""
    multi = len(blocks) > 1
    pieces = []
    for index, text in enumerate(blocks, start=1):
        header = f"REPL output (block {index}):" if multi else "REPL output:"
        pieces.append(f"{header}\n{truncate_head(text, output_chars)}")
    return "\n\n".join(pieces)


def cap_text(text: str, limit: int = EVENT_TEXT_CAP) -> str:
    """Cap a string for an event record."""
    return truncate_head(text, limit)


def cap_messages(messages: list[dict[str, str]], limit: int = EVENT_TEXT_CAP) -> list[dict[str, Any]]:
    """Copies of chat messages with every content capped, for `turn` events."""
    return [{"role": m["role"], "content": cap_text(m["content"], limit)} for m in messages]


def head_tail(text: str, limit: int) -> str:
    """The first and last `limit // 2` characters with a marker between (sub-call records:
    an answer's end matters as much as its start)."""
    if len(text) <= limit:
        return text
    head = limit - limit // 2
    tail = limit // 2
    return text[:head] + f"\n…[{len(text) - head - tail} chars]…\n" + (text[-tail:] if tail else "")
