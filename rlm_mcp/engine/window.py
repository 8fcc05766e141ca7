"""Keeping the root conversation inside the root model's window.

Before every root call the full completion budget must stay free. When the history is too
long, whole REPL outputs are replaced by a short marker, oldest first, then old replies; the
newest output is cut only if it alone does not fit; the completion budget shrinks last, never
below the floor. Elision goes well below the limit (to `target_fraction` of the window) so the
next several turns append without touching earlier messages and vLLM's prefix cache hits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rlm_mcp.engine.messages import CUT_OUTPUT, ELIDED_OUTPUT, ELIDED_REPLY, History
from rlm_mcp.ports import ChatModel

log = logging.getLogger("rlm_mcp.engine")

TARGET_FRACTION = 0.6
# An upper bound on the prompt's tokens without asking the server: a byte-level BPE token
# covers at least one UTF-8 byte, and the chat template adds a few tokens per message.
_BOUND_PER_MESSAGE = 16
_BOUND_PER_PROMPT = 64


class WindowTooSmallError(Exception):
    """Even with everything elidable elided, the completion budget would fall below the floor."""


@dataclass
class WindowFit:
    max_tokens: int  # completion budget to request
    prompt_tokens: int  # counted size of the history as it will be sent
    elided: list[int] = field(default_factory=list)  # indices elided by this call
    cut_newest: bool = False  # the newest REPL output had to be shortened
    tokens_before: int = 0


async def fit_history(
    history: History,
    lm: ChatModel,
    *,
    model: str,
    window: int,
    max_tokens: int,
    floor: int,
    target_fraction: float = TARGET_FRACTION,
) -> WindowFit:
    """Make `history` fit `window` with `max_tokens` free; mutate it in place; say what was done."""
    limit = window - max_tokens
    bound = token_upper_bound(history.messages)
    if bound <= limit:
        # Surely fits: skip the exact count, one HTTP round trip less per turn (most turns).
        return WindowFit(max_tokens=max_tokens, prompt_tokens=bound, tokens_before=bound)
    count = await lm.count_tokens(history.messages, model=model)
    fit = WindowFit(max_tokens=max_tokens, prompt_tokens=count, tokens_before=count)
    if count <= limit:
        return fit
    target = max(0, min(limit, int(window * target_fraction)))
    newest_output = _newest_output(history)

    # 1) whole REPL outputs (and host notices), oldest first; 2) then old replies.
    for kinds, marker in ((("output", "notice"), ELIDED_OUTPUT), (("assistant",), ELIDED_REPLY)):
        for index in _candidates(history, kinds, newest_output):
            if count <= target:
                break
            _elide(history, index, marker)
            fit.elided.append(index)
            count = await lm.count_tokens(history.messages, model=model)
        if count <= target:
            break

    # 3) the newest output alone is too big: keep its head.
    if count > limit and newest_output is not None:
        for _ in range(4):
            if count <= limit:
                break
            message = history.entries[newest_output].message
            own = await lm.count_tokens([message], model=model)
            room = own - (count - limit)
            keep = max(0, int(len(message["content"]) * max(room, 0) / max(own, 1) * 0.9) - len(CUT_OUTPUT) - 16)
            original = message["content"]
            dropped = len(original) - keep
            if dropped <= 0:
                break
            message["content"] = original[:keep] + CUT_OUTPUT.format(chars=dropped)
            fit.cut_newest = True
            count = await lm.count_tokens(history.messages, model=model)

    fit.prompt_tokens = count
    # 4) last resort: a smaller completion budget, never below the floor.
    if count > limit:
        fit.max_tokens = window - count
        if fit.max_tokens < floor:
            raise WindowTooSmallError(
                f"the conversation needs {count} tokens of the {window}-token window, leaving "
                f"{max(fit.max_tokens, 0)} for the reply (minimum {floor})"
            )
    if fit.elided or fit.cut_newest:
        log.info("history elided: %d messages, %d -> %d tokens", len(fit.elided), fit.tokens_before, count)
    return fit


def token_upper_bound(messages: list[dict[str, str]]) -> int:
    """At least as many tokens as any byte-level BPE chat template makes of `messages`."""
    total = _BOUND_PER_PROMPT
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else str(content or "")
        # ASCII text is one byte per char: no need to encode it just to measure it.
        total += _BOUND_PER_MESSAGE + (len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")))
    return total


def _newest_output(history: History) -> int | None:
    for index in range(len(history) - 1, -1, -1):
        if history.entries[index].kind == "output":
            return index
    return None


def _candidates(history: History, kinds: tuple[str, ...], newest_output: int | None) -> list[int]:
    """Elidable messages, oldest first: never system/metadata/turn messages, nor the latest turn."""
    entries = history.entries
    latest_turn = entries[-1].turn if entries else 0
    last_reply_turn = max((e.turn for e in entries if e.kind == "assistant"), default=0)
    out = []
    for index, entry in enumerate(entries):
        if entry.kind not in kinds or entry.elided or index == newest_output:
            continue
        if entry.turn >= latest_turn or (entry.kind == "assistant" and entry.turn >= last_reply_turn):
            continue
        out.append(index)
    return out


def _elide(history: History, index: int, marker: str) -> None:
    entry = history.entries[index]
    entry.message["content"] = marker.format(chars=len(entry.message["content"]))
    entry.elided = True
