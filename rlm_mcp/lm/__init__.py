"""The LM layer: an async client of OpenAI-compatible endpoints (vLLM first).

Owns root/sub model routing, retries with backoff (429, 5xx, connection errors), per-call
usage, bounded concurrency, window discovery (/v1/models) and token counting (/tokenize, else
an estimate); and the phrasing of endpoint failures (lm/errors.py factories).
Must not parse code or touch sandboxes. A new LM backend (another API, an endpoint pool) is a
new client here that satisfies the engine's `ChatModel` protocol (rlm_mcp/ports/).
"""

from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.discovery import DEFAULT_WINDOW, ProbeResult
from rlm_mcp.lm.errors import (
    LMConnectionError,
    LMContextLengthError,
    LMError,
    LMMalformedResponseError,
    LMModelNotFoundError,
    LMRequestError,
    LMServerError,
)
from rlm_mcp.lm.types import CallRecord, Completion, TokenCount, Usage

__all__ = [
    "DEFAULT_WINDOW",
    "CallRecord",
    "Completion",
    "LMClient",
    "LMConnectionError",
    "LMContextLengthError",
    "LMError",
    "LMMalformedResponseError",
    "LMModelNotFoundError",
    "LMRequestError",
    "LMServerError",
    "ProbeResult",
    "TokenCount",
    "Usage",
]
