"""`--baseline direct`: the same model called once, with the context cut to fit its window.

This is the card's "plain long-context call": no REPL, no sub-calls. The context keeps its
head (what fits), the question comes after it, and the completion keeps `root_max_tokens`
(or half the window, if smaller) free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.lm.client import LMClient
from rlm_mcp.ports.chat import LMError
from rlm_mcp.ports.runs import Usage

SYSTEM = "You are a helpful assistant. Answer the question about the context that the user gives you."
_MAX_CUTS = 6
_BYTES_PER_TOKEN_CAP = 8  # no tokenizer packs more bytes in a token: never read more than this


def direct_messages(context: str, query: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {query}"},
    ]


async def read_head(path: Path, limit_bytes: int) -> tuple[str, bool]:
    """At most `limit_bytes` of a stored context as text, and whether it was cut."""

    def work() -> tuple[str, bool]:
        with path.open("rb") as f:
            data = f.read(limit_bytes + 1)
        cut = len(data) > limit_bytes
        return data[:limit_bytes].decode("utf-8", errors="ignore"), cut

    return await anyio.to_thread.run_sync(work)


@dataclass
class DirectResult:
    answer: str | None
    status: str
    usage: Usage
    duration_s: float
    context_chars: int  # characters of context the call carried
    cut: bool  # whether the context was cut to fit
    error: str | None = None


async def fit_context(
    lm: LMClient, settings: Settings, blob: Path, query: str
) -> tuple[list[dict[str, str]], int, bool]:
    """Messages that fit the window with the completion budget left, as much context as fits."""
    window = await lm.window(settings.lm.model)
    completion = min(settings.lm.root_max_tokens, window // 2)
    budget = window - completion
    text, cut = await read_head(blob, budget * _BYTES_PER_TOKEN_CAP)
    for _ in range(_MAX_CUTS):
        messages = direct_messages(text, query)
        used = await lm.count_tokens(messages, model=settings.lm.model)
        if used <= budget:
            return messages, len(text), cut
        keep = max(0, int(len(text) * budget / used * 0.95) - 1)
        text, cut = text[:keep], True
    return direct_messages("", query), 0, True


async def run_direct(lm: LMClient, settings: Settings, blob: Path, query: str) -> DirectResult:
    """One call; an LM failure is a result with status `error`, never an exception."""
    started = time.monotonic()
    usage = Usage()
    try:
        messages, chars, cut = await fit_context(lm, settings, blob, query)
        window = await lm.window(settings.lm.model)
        completion = await lm.complete(
            messages, model=settings.lm.model, max_tokens=min(settings.lm.root_max_tokens, window // 2), role="root"
        )
    except LMError as exc:
        if exc.record is not None:
            usage.add_call(exc.record)
        return DirectResult(None, "error", usage, time.monotonic() - started, 0, False, error=str(exc))
    usage.add_call(completion.record)
    return DirectResult(completion.text, "completed", usage, time.monotonic() - started, chars, cut)
