"""Value types shared by the LM client and its callers (engine, service)."""

from __future__ import annotations

from dataclasses import dataclass

from rlm_mcp.events import CallRole, CallStatus, TokenCount, Usage

# Usage has one shape everywhere (rlm_mcp.events, re-exported by rlm_mcp.ports.runs).
__all__ = ["CallRecord", "Completion", "TokenCount", "Usage"]


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
    # Of prompt_tokens, those the server answered from its prefix cache (0 when it does not say).
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class Completion:
    """The text of one chat completion and how it ended."""

    text: str
    finish_reason: str | None
    record: CallRecord
