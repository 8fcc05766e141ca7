"""The one text rule every string crossing a port follows: valid Unicode text. A lone UTF-16
surrogate (a JSON `\\ud83d` escape of half a character, from a sandbox's frame or an LM's reply)
cannot be encoded as UTF-8 and would make whatever keeps it (a run record, the next request)
fail later; it becomes U+FFFD where the host parses it (`sandbox.frames`, `lm.responses`)."""

from __future__ import annotations

import re

__all__ = ["LONE_SURROGATE", "REPLACEMENT", "valid_text"]

REPLACEMENT = "\ufffd"
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with every lone UTF-16 surrogate replaced by U+FFFD (it is valid UTF-8 then)."""
    if text.isascii():  # no surrogate: a check in C instead of the pattern's scan (every LM reply)
        return text
    return LONE_SURROGATE.sub(REPLACEMENT, text)
