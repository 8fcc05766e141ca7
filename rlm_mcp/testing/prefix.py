"""What a prefix cache (vLLM's automatic prefix caching) could reuse, per session.

vLLM keeps the KV blocks of a request's prompt *and* of its generated tokens; the next request
of the same conversation reuses the longest common prefix with them and prefills only the rest.
The scripted server renders each chat request into tokens as its tokenizer counts them (per
message: 3 template tokens, the content in 4-byte tokens, an end token; then 3 tokens of
generation prompt), and for each root request of a session records the longest common prefix
with the session's previous request followed by that request's completion.

A session is what the replica router keys on: the `X-Session-ID` header (the run id); root
requests without one share the session "". Reuse is counted in tokens, not in vLLM's 16-token
blocks, so it is an upper bound by at most one block per request.

`render` and `common_prefix` define the count; the ledger computes the same number message by
message (`reused_tokens`) without rendering: a root request of a few thousand tokens otherwise
costs the server more CPU than everything else it does for that request, on every turn.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rlm_mcp.testing.script import BYTES_PER_TOKEN, count_prompt_tokens, count_text_tokens, message_text

Token = bytes | tuple[str, str]  # content bytes, or a template marker
Said = tuple[str, str]  # a message as the template renders it: (role, content text)
_ASSISTANT = "assistant"
_COMPARE_STEP = 1 << 16  # bytes compared per slice while looking for a first difference


def _text_tokens(text: str) -> list[Token]:
    data = text.encode("utf-8")
    return [data[i : i + BYTES_PER_TOKEN] for i in range(0, len(data), BYTES_PER_TOKEN)]


def render(messages: list[dict[str, Any]]) -> list[Token]:
    """The prompt's tokens, as many as `count_prompt_tokens` says (generation prompt included)."""
    out: list[Token] = []
    for m in messages:
        role = str(m.get("role", ""))
        out += [("start", ""), ("role", role), ("nl", "")]
        out += _text_tokens(message_text(m.get("content")))
        out.append(("end", ""))
    out += [("start", ""), ("role", "assistant"), ("nl", "")]
    return out


def common_prefix(a: list[Token], b: list[Token]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def said(messages: list[dict[str, Any]]) -> list[Said]:
    """Each message as (role, content text): all `render` reads of it."""
    return [(str(m.get("role", "")), message_text(m.get("content"))) for m in messages]


def _common_bytes(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    alike = 0  # a[:alike] == b[:alike]
    while alike < n and a[alike : alike + _COMPARE_STEP] == b[alike : alike + _COMPARE_STEP]:
        alike = min(n, alike + _COMPARE_STEP)  # a whole slice alike: compared in C
    most = min(n, alike + _COMPARE_STEP)  # the first difference is before this (or n is)
    while alike < most:  # halving what is left of that slice
        mid = (alike + most + 1) // 2
        if a[alike:mid] == b[alike:mid]:
            alike = mid
        else:
            most = mid - 1
    return alike


def _common_text_tokens(a: str, b: str) -> int:
    """Tokens alike at the start of two different texts' token lists: the 4-byte tokens that lie
    wholly within their common bytes (the token at the first difference, or where the shorter one
    ends, differs: a shorter last token, or the other side's next token or end marker)."""
    return _common_bytes(a.encode("utf-8"), b.encode("utf-8")) // BYTES_PER_TOKEN


def reused_tokens(new: list[Said], previous: list[Said], completion: str) -> int:
    """`common_prefix(render(new), render(previous) + _text_tokens(completion))`, computed per
    message: a message alike on both sides is all alike (4 template tokens and its text's), the
    first that differs ends the prefix inside it."""
    count = 0
    for (role, text), (old_role, old_text) in zip(new, previous, strict=False):
        if role != old_role:
            return count + 1  # the start marker
        if text != old_text:
            return count + 3 + _common_text_tokens(text, old_text)
        count += 4 + count_text_tokens(text)
    if len(new) == len(previous):
        return count + 3  # both go on with the generation prompt; the new request ends there
    if len(new) < len(previous):  # the new generation prompt against an older message
        return count + (3 if previous[len(new)][0] == _ASSISTANT else 1)
    role, text = new[len(previous)]  # the previous request's generation prompt and completion
    if role != _ASSISTANT:
        return count + 1
    if text == completion:
        return count + 3 + count_text_tokens(text)  # then the new one's end marker
    return count + 3 + _common_text_tokens(text, completion)


@dataclass
class PrefixTurn:
    session: str
    prompt_tokens: int
    reused_tokens: int  # longest common prefix with the previous request + its completion

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.reused_tokens


@dataclass
class PrefixLedger:
    """Per session: the last request's messages and its completion; every root request's reuse."""

    turns: list[PrefixTurn] = field(default_factory=list)
    _cached: dict[str, tuple[list[Said], str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def request(self, session: str, messages: list[dict[str, Any]], prompt_tokens: int | None = None) -> list[Said]:
        """Record a root request; return its messages as compared (give them back to `completed`).
        `prompt_tokens`: its `count_prompt_tokens` (the length of its `render`), when known."""
        new = said(messages)
        if prompt_tokens is None:
            prompt_tokens = count_prompt_tokens(messages)
        with self._lock:
            cached = self._cached.get(session)
            reused = 0 if cached is None else reused_tokens(new, *cached)
            self.turns.append(PrefixTurn(session, prompt_tokens, reused))
        return new

    def completed(self, session: str, new: list[Said], completion: str) -> None:
        with self._lock:
            self._cached[session] = (new, completion)

    def by_session(self, session: str) -> list[PrefixTurn]:
        with self._lock:
            return [t for t in self.turns if t.session == session]
