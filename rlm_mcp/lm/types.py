"""Value types shared by the LM client and its callers (engine, service)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlm_mcp.events import CallRole, CallStatus


@dataclass(frozen=True)
class CallRecord:
    """One LM request, as accounted: exact tokens from the server's `usage`."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    status: CallStatus
    role: CallRole = "root"
    error: str | None = None
    # True when the server sent no `usage` and the token counts are local estimates.
    estimated: bool = False
    # Seconds spent waiting for a concurrency slot; not part of latency_s.
    queued_s: float = 0.0


@dataclass
class TokenCount:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "calls": self.calls}


@dataclass
class Usage:
    """Usage aggregated over a run tree: in total and by model."""

    total: TokenCount = field(default_factory=TokenCount)
    by_model: dict[str, TokenCount] = field(default_factory=dict)

    def add(self, record: CallRecord) -> None:
        for bucket in (self.total, self.by_model.setdefault(record.model, TokenCount())):
            bucket.prompt_tokens += record.prompt_tokens
            bucket.completion_tokens += record.completion_tokens
            bucket.calls += 1

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total.to_dict(), "by_model": {m: c.to_dict() for m, c in self.by_model.items()}}


@dataclass(frozen=True)
class Completion:
    """The text of one chat completion and how it ended."""

    text: str
    finish_reason: str | None
    record: CallRecord
