"""Local token estimates, used only when the server cannot count for us.

They must over-count: the engine keeps the completion budget free based on them, and an
under-count sends a request the server rejects for length. ceil(utf-8 bytes / 3) is above
what Qwen's BPE produces for English prose, code and CJK text (CJK: 3 bytes per character,
about one token per character); the per-message overhead covers the chat template's role
markers with room to spare.
"""

from __future__ import annotations

import math
from typing import Any

BYTES_PER_TOKEN = 3
# The most tokens a server may say one request or reply holds: far past any model's window, far
# below what a record, a metric (a float) or a database column (a bigint) can hold. A count the
# server reports past it, or below 0, is not a count: the reply is read as one without usage.
MAX_REPORTED_TOKENS = 1 << 31
MESSAGE_OVERHEAD = 8
PROMPT_OVERHEAD = 8  # generation prompt and BOS-like markers


def content_text(content: Any) -> str:
    """Message content as text (a string, or the text parts of an OpenAI parts list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def reported_count(value: Any) -> int | None:
    """A token count as a server reported it, or None when it is none: absent, not an integer
    (a bool is not one), negative, or past MAX_REPORTED_TOKENS."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REPORTED_TOKENS:
        return value
    return None


def estimate_text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """A conservative (over-)estimate of the prompt tokens the chat template will produce."""
    return PROMPT_OVERHEAD + sum(
        MESSAGE_OVERHEAD + estimate_text_tokens(content_text(m.get("content"))) for m in messages
    )
