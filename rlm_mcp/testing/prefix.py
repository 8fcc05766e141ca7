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
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rlm_mcp.testing.script import BYTES_PER_TOKEN, message_text

Token = bytes | tuple[str, str]  # content bytes, or a template marker


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
    """Per session: the last request's tokens plus its completion; every root request's reuse."""

    turns: list[PrefixTurn] = field(default_factory=list)
    _cached: dict[str, list[Token]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def request(self, session: str, messages: list[dict[str, Any]]) -> list[Token]:
        """Record a root request; return its tokens (give them back to `completed`)."""
        tokens = render(messages)
        with self._lock:
            previous = self._cached.get(session, [])
            self.turns.append(PrefixTurn(session, len(tokens), common_prefix(tokens, previous)))
        return tokens

    def completed(self, session: str, tokens: list[Token], completion: str) -> None:
        with self._lock:
            self._cached[session] = tokens + _text_tokens(completion)

    def by_session(self, session: str) -> list[PrefixTurn]:
        with self._lock:
            return [t for t in self.turns if t.session == session]
