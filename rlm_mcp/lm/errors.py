"""LM endpoint failures, each naming the endpoint and what to check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlm_mcp.errors import LMUnavailableError

if TYPE_CHECKING:
    from rlm_mcp.lm.types import CallRecord


class LMError(LMUnavailableError):
    """Base of LM failures. `retryable` says whether a later identical request may succeed."""

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
        # The failed call as accounted (status "error"); set by LMClient.complete.
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
