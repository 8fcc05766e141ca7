"""The chat contract: what one LM call returns and how it fails, as the engine and the LM
client agree on it.

The engine talks to a `ChatModel` (ports/engine.py) and reads `Completion`s and `CallRecord`s;
the LM layer (`rlm_mcp.lm`) implements it and raises the `LMError` family below (its factories in
`lm/errors.py` phrase each failure, naming the endpoint and the setting that fixes it). Living
here, neither imports the other, and importing the engine loads no HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.events import CallRole, CallStatus

DEFAULT_WINDOW = 16384
"""The context window assumed for a model whose window is unknown (what the rlm-v0.1 adapter was
trained with)."""


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
    # USD by the price table (RLM_MCP_MODEL_PRICES); None when the model has no price.
    cost_usd: float | None = None
    # Attempts after the first (any cause); of all attempts, those answered 429/503 ("less load");
    # and the seconds slept between attempts (part of latency_s, not of queued_s).
    retries: int = 0
    throttled: int = 0
    backoff_s: float = 0.0


@dataclass(frozen=True)
class Completion:
    """The text of one chat completion and how it ended."""

    text: str
    finish_reason: str | None
    record: CallRecord


class LMError(RlmMcpError):
    """Base of LM endpoint failures (unreachable, model unknown, request refused or too long).
    `retryable` says whether a later identical request may succeed."""

    retryable = False

    def __init__(
        self,
        cause: str,
        fix: str | None = None,
        *,
        endpoint: str = "",
        status: int | None = None,
        server_message: str | None = None,
    ) -> None:
        super().__init__(cause, fix)
        self.endpoint = endpoint
        self.status = status
        # The server's own error text, verbatim (e.g. vLLM's context-length message).
        self.server_message = server_message
        # The failed call as accounted (status "error"); set by the client that made it.
        self.record: CallRecord | None = None


class LMConnectionError(LMError):
    """Nothing answers at the endpoint (refused, DNS, TLS) or it timed out."""

    retryable = True


class LMServerError(LMError):
    """5xx or 429 after the retries were spent."""

    retryable = True


class LMModelNotFoundError(LMError):
    """404: the endpoint does not serve the model asked for."""


class LMContextLengthError(LMError):
    """400 because prompt (+ completion budget) exceeds the model's window."""


class LMRequestError(LMError):
    """Any other 4xx: the request itself is wrong (auth, validation)."""


class LMMalformedResponseError(LMError):
    """The endpoint answered 200 with something that is not a chat completion."""


__all__ = [
    "DEFAULT_WINDOW",
    "CallRecord",
    "Completion",
    "LMConnectionError",
    "LMContextLengthError",
    "LMError",
    "LMMalformedResponseError",
    "LMModelNotFoundError",
    "LMRequestError",
    "LMServerError",
]
