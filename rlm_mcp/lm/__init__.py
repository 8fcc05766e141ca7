"""The LM layer: an async client of OpenAI-compatible endpoints (vLLM first)."""

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
