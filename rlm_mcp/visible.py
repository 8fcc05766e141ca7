"""Text for a person's terminal, made harmless.

Anything a model, a context or another owner wrote (an answer, a query, a context name, a task
id from a downloaded benchmark) may hold terminal controls: OSC 52 writes the clipboard, OSC 0
sets the title, CSI sequences clear the screen or move the cursor, OSC 8 hides a link behind
other text, a carriage return overwrites what the line said, bidi overrides reorder it. Every
human-readable output passes such text through `visible` (multi-line text: newline and tab
kept) or `visible_line` (one table cell: newline and tab shown too, so a value cannot forge a
row). Each control becomes its escape, e.g. ESC -> `\\x1b`, so it is seen, not obeyed.
Machine output (`--json`, JSONL exports) stays exact: JSON escapes controls itself.
"""

from __future__ import annotations

import re

__all__ = ["visible", "visible_line"]

# C0 except newline and tab, DEL, C1, and the Unicode bidi embeddings, overrides and isolates.
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_IN_TEXT = re.compile(f"[{_CONTROLS}]")
_IN_LINE = re.compile(f"[{_CONTROLS}\t\n]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every terminal control shown as its escape; newline and tab kept."""
    return _IN_TEXT.sub(_shown, text)


def visible_line(text: str) -> str:
    """`text` as one line: newline and tab shown as escapes too."""
    return _IN_LINE.sub(_shown, text)
