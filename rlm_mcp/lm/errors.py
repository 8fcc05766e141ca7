"""LM endpoint failures, each naming the endpoint and what to check."""

from __future__ import annotations

from collections.abc import Sequence

# The failure classes are the chat contract's (rlm_mcp.ports.chat); this module phrases them.
from rlm_mcp.ports.chat import (
    LMConnectionError,
    LMContextLengthError,
    LMError,
    LMMalformedResponseError,
    LMModelNotFoundError,
    LMRequestError,
    LMServerError,
)

__all__ = [
    "error_kind",
    "key_refused",
    "listing_failed",
    "listing_unusable",
    "model_not_served",
    "no_choices",
    "not_json",
    "path_missing",
    "probe_failed",
    "request_refused",
    "server_busy",
    "timed_out",
    "too_long",
    "unreachable",
    "unreadable",
    "where",
]


_KINDS: tuple[tuple[type[LMError], str], ...] = (
    (LMConnectionError, "connection"),
    (LMServerError, "server"),
    (LMContextLengthError, "context_length"),
    (LMModelNotFoundError, "model_not_found"),
    (LMMalformedResponseError, "malformed"),
    (LMRequestError, "request"),
)


def error_kind(error: LMError) -> str:
    """A short, closed-set name of a failure's kind (the `kind` label of the LM error metrics)."""
    for cls, kind in _KINDS:
        if isinstance(error, cls):
            return kind
    return "other"


# --- every message of the LM layer, phrased in one place ---------------------------------------
# `setting` is the variable that sets the endpoint's address (RLM_MCP_BASE_URL or
# RLM_MCP_SUB_BASE_URL), `where` how a message names the endpoint ("the LM endpoint at URL
# (vLLM)"): a failure always says which endpoint failed and what it is, when that is known.

VLLM_HINT = (
    "`vllm serve Qwen/Qwen3-30B-A3B-Instruct-2507 --enable-lora --max-lora-rank 64 "
    "--lora-modules rlm-v0.1=<adapter> --max-model-len 16384`"
)


def where(label: str, base_url: str, kind: str | None) -> str:
    """'the sub-call endpoint at http://h/v1 (vLLM)'; the kind only when it is known."""
    return f"{label} at {base_url}" + (f" ({kind})" if kind else "")


def unreachable(label: str, base_url: str, kind: str | None, setting: str, detail: str) -> LMConnectionError:
    start = f"Start the server there (the adapter on vLLM: {VLLM_HINT})" if kind in (None, "vLLM") else "Start it"
    place = where(label, base_url, kind)
    return LMConnectionError(
        f"{place[:1].upper()}{place[1:]} is unreachable ({detail}).",
        f"{start} or set {setting} to a running OpenAI-compatible endpoint.",
        endpoint=base_url,
    )


def timed_out(url: str, model: str, detail: str, limit_s: float) -> LMConnectionError:
    return LMConnectionError(
        f"The request to {url} (model '{model}') timed out ({detail}, limit {limit_s:g} s).",
        "Check the server's load and log, or raise RLM_MCP_REQUEST_TIMEOUT_S.",
        endpoint=url,
    )


def unreadable(url: str, model: str, detail: str, setting: str) -> LMMalformedResponseError:
    return LMMalformedResponseError(
        f"The answer of {url} (model '{model}') could not be read: {detail}.",
        f"Check that {setting} points at an OpenAI-compatible server (…/v1).",
        endpoint=url,
    )


def _not_openai(url: str, status: int, answered: str, setting: str) -> LMMalformedResponseError:
    """The server answered, but not as an OpenAI-compatible /v1 endpoint does."""
    return LMMalformedResponseError(
        f"{url} answered {answered}",
        f"Check that {setting} is the /v1 URL of an OpenAI-compatible server.",
        endpoint=url,
        status=status,
    )


def not_json(url: str, status: int, body: str, setting: str) -> LMMalformedResponseError:
    return _not_openai(url, status, f"HTTP {status} with a body that is not JSON: {body[:200]!r}", setting)


def no_choices(url: str, status: int, data: object, setting: str) -> LMMalformedResponseError:
    return _not_openai(url, status, f"without `choices`: {str(data)[:200]}", setting)


def server_busy(url: str, status: int, model: str, attempts: int, message: str) -> LMServerError:
    fix = (
        "The server is rate-limiting or busy: lower RLM_MCP_MAX_CONCURRENT_LM_CALLS or retry later."
        if status in (429, 503)
        else "Check the server's log; vLLM answers 500 when its engine died and must be restarted."
    )
    return LMServerError(
        f"{url} answered HTTP {status} for model '{model}' (attempt {attempts}): {message}",
        fix,
        endpoint=url,
        status=status,
        server_message=message,
    )


def too_long(url: str, status: int, model: str, message: str, window_setting: str) -> LMContextLengthError:
    return LMContextLengthError(
        f"The request does not fit model '{model}''s window at {url}: {message}",
        "Shorten the prompt or lower the completion budget (RLM_MCP_ROOT_MAX_TOKENS, "
        f"RLM_MCP_SUB_MAX_TOKENS); set {window_setting} if the window was guessed wrong.",
        endpoint=url,
        status=status,
        server_message=message,
    )


def path_missing(url: str, message: str, setting: str) -> LMModelNotFoundError:
    return LMModelNotFoundError(
        f"{url} does not exist (HTTP 404: {message}).",
        f"Check {setting}: it must be the /v1 URL of an OpenAI-compatible server.",
        endpoint=url,
        status=404,
        server_message=message,
    )


def request_refused(url: str, status: int, model: str, message: str, body_setting: str) -> LMRequestError:
    return LMRequestError(
        f"{url} rejected the request for model '{model}' (HTTP {status}): {message}",
        f"Check {body_setting} and the server's log.",
        endpoint=url,
        status=status,
        server_message=message,
    )


def listing_failed(url: str, status: int) -> LMServerError:
    return LMServerError(
        f"{url} answered HTTP {status}.",
        "Check the server's log; vLLM answers 500 when its engine died.",
        endpoint=url,
        status=status,
    )


def model_not_served(
    model: str,
    base_url: str,
    served: Sequence[str] | None,
    *,
    endpoint: str,
    server_message: str | None = None,
    model_setting: str = "RLM_MCP_MODEL (root) or RLM_MCP_SUB_MODEL (sub-calls)",
) -> LMModelNotFoundError:
    """The endpoint answers but does not serve `model` (a chat call's 404, or /v1/models)."""
    listed = list(served) if served is not None else "(unknown)"
    return LMModelNotFoundError(
        f"model '{model}' is not served at {base_url}; served: {listed}.",
        f"Set {model_setting} to a served name, or load the adapter with `--lora-modules {model}=<path>`.",
        endpoint=endpoint,
        status=404,
        server_message=server_message,
    )


def key_refused(
    url: str, status: int, *, server_message: str | None = None, key_setting: str = "RLM_MCP_API_KEY"
) -> LMRequestError:
    """The endpoint refused the API key (401/403)."""
    said = f": {server_message}" if server_message else ""
    return LMRequestError(
        f"{url} refused the API key (HTTP {status}){said}.",
        f"Set {key_setting} to the key the server was started with (vLLM: --api-key).",
        endpoint=url,
        status=status,
        server_message=server_message,
    )


def probe_failed(base_url: str, exc: BaseException) -> str:
    return f"probe of {base_url} failed: {exc!r}"


def listing_unusable(url: str, status: int | None) -> str:
    """Why /v1/models gave no cards (logged; discovery failing is never fatal)."""
    return f"{url}: HTTP {status}" if status != 200 else f"{url} did not answer JSON"
