"""The async client of an OpenAI-compatible endpoint (vLLM first): the engine's `ChatModel`.

Plain HTTP (aiohttp, see `rlm_mcp.lm.http`) rather than the `openai` SDK: we run our own retry policy (the SDK's would
stack under it), we need the raw status, headers and error body to classify failures
(context length, unknown model, Retry-After), and we must tolerate responses the SDK's
models reject or hide (no `usage`, `reasoning_content`, broken JSON). One `HttpPool` holds
one keep-alive pool for every call of the process.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, TypedDict
from urllib.parse import urlsplit

import anyio

from rlm_mcp.access import is_loopback_host
from rlm_mcp.config import Settings
from rlm_mcp.lm.discovery import (
    DEFAULT_WINDOW,
    ProbeResult,
    model_cards,
    serves_props,
    window_from_cards,
    window_from_props,
)
from rlm_mcp.lm.errors import (
    LMConnectionError,
    LMContextLengthError,
    LMError,
    LMMalformedResponseError,
    LMModelNotFoundError,
    LMRequestError,
    LMServerError,
    key_refused,
    model_not_served,
)
from rlm_mcp.lm.http import HttpError, HttpPool, HttpReply, HttpTimeout, HttpTransportError, encode_json
from rlm_mcp.lm.length_field import CompletionLengthField, set_budget
from rlm_mcp.lm.responses import Role, parse_completion, server_message
from rlm_mcp.lm.retry import TOTAL_SLEEP_CAP_S, backoff_s, retry_after_s, retryable_status
from rlm_mcp.lm.tokens import estimate_tokens
from rlm_mcp.lm.types import CallRecord, Completion

log = logging.getLogger("rlm_mcp.lm")


VLLM_HINT = (
    "`vllm serve Qwen/Qwen3-30B-A3B-Instruct-2507 --enable-lora --max-lora-rank 64 "
    "--lora-modules rlm-v0.1=<adapter> --max-model-len 16384`"
)


class _Origin(TypedDict):
    """Where a failed reply came from, as every LMError records it."""

    endpoint: str
    status: int
    server_message: str


_CONTEXT_RE = re.compile(
    r"context length|context_length_exceeded|exceed_context_size|max_model_len|context window", re.I
)
_DISCOVERY_TIMEOUT_S = 10.0
_DISCOVERY_RETRY_S = 30.0  # after a failed /v1/models, ask again no sooner than this


class LMClient:
    """Talks to one endpoint for every run, root and sub, at every depth. Connects lazily."""

    def __init__(self, settings: Settings, *, backoff_base_s: float | None = None) -> None:
        self._settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")  # /tokenize and /health live here
        self._retries = max(0, settings.lm_retries)
        # Tests shorten the backoff; 0.5 s doubling is the SDKs' convention.
        self._backoff_base_s = 0.5 if backoff_base_s is None else backoff_base_s
        self._http: HttpPool | None = None
        # anyio primitives bind to the running event loop, so they are made on first use.
        self._limiter: anyio.Semaphore | None = None
        self._discovery_lock: anyio.Lock | None = None
        self._cards: list[dict[str, Any]] | None = None
        self._cards_failed_at: float | None = None
        self._windows: dict[str, int] = {}
        self._known_windows: set[str] = set()  # windows the server itself reported
        self._tokenize_ok: bool | None = None
        self._length_field = CompletionLengthField(settings.completion_tokens_field, self.base_url)

    # --- plumbing ---------------------------------------------------------------------------
    def _client(self) -> HttpPool:
        if self._http is None:
            s = self._settings
            headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
            self._http = HttpPool(
                headers=headers,
                timeout_s=s.request_timeout_s,
                connect_s=min(10.0, s.request_timeout_s),
                trust_env=not is_loopback_host(urlsplit(self.base_url).hostname or ""),
            )
        return self._http

    def _slots(self) -> anyio.Semaphore:
        if self._limiter is None:
            self._limiter = anyio.Semaphore(max(1, self._settings.max_concurrent_lm_calls), fast_acquire=True)
        return self._limiter

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> LMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _unreachable(self, exc: Exception) -> LMConnectionError:
        detail = str(exc) or type(exc).__name__
        return LMConnectionError(
            f"vLLM at {self.base_url} is unreachable ({detail}).",
            f"Start it with {VLLM_HINT} or set RLM_MCP_BASE_URL to a running OpenAI-compatible endpoint.",
            endpoint=self.base_url,
        )

    # --- completions ------------------------------------------------------------------------
    async def complete(self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: Role) -> Completion:
        """One non-streamed chat completion, retried on transient failures.

        Raises an `LMError`; its `record` is the failed call as accounted.
        """
        base: dict[str, Any] = {**self._settings.extra_body, "model": model, "messages": messages, "stream": False}
        field = self._length_field.field_for(model)
        body = set_budget(base, field, max_tokens)
        started = time.perf_counter()
        queued = [0.0]  # filled by _post_completion, also when it raises
        try:
            try:
                response = await self._post_completion(body, model, queued)
            except LMRequestError as refused:
                if not self._length_field.switch_after(model, field, refused.status, refused.server_message or ""):
                    raise
                log.info("%s refused max_tokens for model %s; using max_completion_tokens", self.base_url, model)
                body = set_budget(base, "max_completion_tokens", max_tokens)
                response = await self._post_completion(body, model, queued)
            completion = parse_completion(response, messages, model, role, started, queued[0])
        except LMError as err:
            err.record = CallRecord(
                model,
                0,
                0,
                time.perf_counter() - started - queued[0],
                "error",
                role,
                error=str(err),
                queued_s=queued[0],
            )
            raise
        return completion

    async def _post_completion(self, body: dict[str, Any], model: str, queued: list[float]) -> HttpReply:
        url = f"{self.base_url}/chat/completions"
        slept = 0.0
        payload = encode_json(body)
        for attempt in range(self._retries + 1):
            wait: float | None = None
            # The slot is held for one attempt only: a call backing off must not starve others.
            asked = time.perf_counter()
            async with self._slots():
                queued[0] += time.perf_counter() - asked
                try:
                    response = await self._client().request("POST", url, json_body=payload)
                except HttpTimeout as exc:
                    failure: LMError = LMConnectionError(
                        f"The request to {url} (model '{model}') timed out ({exc}, "
                        f"limit {self._settings.request_timeout_s:g} s).",
                        "Check the server's load and log, or raise RLM_MCP_REQUEST_TIMEOUT_S.",
                        endpoint=url,
                    )
                except HttpTransportError as exc:
                    failure = self._unreachable(exc)
                except HttpError as exc:  # a corrupt body (bad encoding), broken framing, ...
                    raise LMMalformedResponseError(
                        f"The answer of {url} (model '{model}') could not be read: {exc}.",
                        "Check that RLM_MCP_BASE_URL points at an OpenAI-compatible server (…/v1).",
                        endpoint=url,
                    ) from exc
                else:
                    if response.status_code < 400:
                        return response
                    failure = await self._status_error(response, url, model, attempt + 1)
                    wait = retry_after_s(response)
            if not failure.retryable or attempt >= self._retries:
                raise failure
            delay = wait if wait is not None else backoff_s(attempt, self._backoff_base_s)
            if slept + delay > TOTAL_SLEEP_CAP_S:
                raise failure
            log.warning(
                "LM call failed (attempt %d/%d), retrying in %.2f s: %s", attempt + 1, self._retries + 1, delay, failure
            )
            await anyio.sleep(delay)
            slept += delay
        raise AssertionError("unreachable")  # the loop always returns or raises

    async def _status_error(self, response: HttpReply, url: str, model: str, attempts: int) -> LMError:
        status, message = response.status_code, server_message(response)
        common = _Origin(endpoint=url, status=status, server_message=message)
        if retryable_status(status):
            fix = (
                "The server is rate-limiting or busy: lower RLM_MCP_MAX_CONCURRENT_LM_CALLS or retry later."
                if status in (429, 503)
                else "Check the server's log; vLLM answers 500 when its engine died and must be restarted."
            )
            return LMServerError(
                f"{url} answered HTTP {status} for model '{model}' (attempt {attempts}): {message}", fix, **common
            )
        if status in (400, 413, 422) and _CONTEXT_RE.search(message + response.text[:2000]):
            return LMContextLengthError(
                f"The request does not fit model '{model}''s window at {url}: {message}",
                "Shorten the prompt or lower the completion budget (RLM_MCP_ROOT_MAX_TOKENS, "
                "RLM_MCP_SUB_MAX_TOKENS); set RLM_MCP_MAX_MODEL_LEN if the window was guessed wrong.",
                **common,
            )
        if status == 404:
            if "model" in message.lower():
                served = await self._served_ids(fresh=True)
                return model_not_served(model, self.base_url, served, endpoint=url, server_message=message)
            return LMModelNotFoundError(
                f"{url} does not exist (HTTP 404: {message}).",
                "Check RLM_MCP_BASE_URL: it must be the /v1 URL of an OpenAI-compatible server.",
                **common,
            )
        if status in (401, 403):
            return key_refused(url, status, server_message=message)
        return LMRequestError(
            f"{url} rejected the request for model '{model}' (HTTP {status}): {message}",
            "Check RLM_MCP_EXTRA_BODY and the server's log.",
            **common,
        )

    # --- discovery --------------------------------------------------------------------------
    async def _fetch_models(self) -> tuple[int | None, list[dict[str, Any]] | None, str | LMError | None]:
        """GET /v1/models once: (HTTP status, None when unreachable; cards or None; the problem)."""
        try:
            response = await self._client().request("GET", f"{self.base_url}/models", timeout_s=_DISCOVERY_TIMEOUT_S)
        except HttpError as exc:
            return None, None, self._unreachable(exc)
        if response.status_code != 200:
            return response.status_code, None, f"{self.base_url}/models: HTTP {response.status_code}"
        try:
            payload = response.json()
        except ValueError:
            return 200, None, f"{self.base_url}/models did not answer JSON"
        return 200, model_cards(payload), None

    async def _model_cards(self, fresh: bool = False) -> list[dict[str, Any]] | None:
        if self._discovery_lock is None:
            self._discovery_lock = anyio.Lock(fast_acquire=True)
        async with self._discovery_lock:
            if self._cards is not None and not fresh:
                return self._cards
            if (
                not fresh
                and self._cards_failed_at is not None
                and time.monotonic() - self._cards_failed_at < _DISCOVERY_RETRY_S
            ):
                return None
            status, cards, error = await self._fetch_models()
            if cards is None:
                log.info("model discovery failed (%s)", error)
                self._cards_failed_at = time.monotonic()
                return None
            self._cards, self._cards_failed_at = cards, None
            return cards

    async def served_cards(self) -> list[dict[str, Any]] | None:
        """The /v1/models cards (cached); None when the endpoint lists none."""
        return await self._model_cards()

    async def _served_ids(self, fresh: bool = False) -> list[str] | None:
        cards = await self._model_cards(fresh=fresh)
        return None if cards is None else [c["id"] for c in cards]

    async def window(self, model: str) -> int:
        """The model's context window: the setting, else /v1/models, else 16384. Never raises."""
        if self._settings.max_model_len:
            return self._settings.max_model_len
        if model in self._windows:
            return self._windows[model]
        cards = await self._model_cards()
        found = window_from_cards(cards, model) if cards else None
        if found is None and serves_props(cards):
            found = await self._props_window()
        if found is not None:
            self._known_windows.add(model)
        else:
            log.info("no window found for model '%s' at %s: assuming %d", model, self.base_url, DEFAULT_WINDOW)
            if cards is None:
                return DEFAULT_WINDOW  # not cached: discovery may work later
            found = DEFAULT_WINDOW
        self._windows[model] = found
        return found

    async def _props_window(self) -> int | None:
        """llama.cpp's served window from GET /props; None when it does not answer one."""
        try:
            response = await self._client().request("GET", f"{self.root_url}/props", timeout_s=_DISCOVERY_TIMEOUT_S)
            return window_from_props(response.json()) if response.status_code == 200 else None
        except (HttpError, ValueError):
            return None

    async def window_known(self, model: str) -> bool:
        """Whether `window(model)` is real (the setting or discovered) rather than the fallback."""
        if self._settings.max_model_len:
            return True
        await self.window(model)
        return model in self._known_windows

    async def count_tokens(self, messages: list[dict[str, str]], *, model: str) -> int:
        """Prompt tokens as the chat template sees them: /tokenize when served, else an over-estimate."""
        if self._tokenize_ok is not False:
            body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
            if "chat_template_kwargs" in self._settings.extra_body:
                body["chat_template_kwargs"] = self._settings.extra_body["chat_template_kwargs"]
            try:
                response = await self._client().request(
                    "POST", f"{self.root_url}/tokenize", json_body=encode_json(body), timeout_s=_DISCOVERY_TIMEOUT_S
                )
            except HttpError as exc:
                log.debug("/tokenize failed (%r): estimating", exc)
            else:
                if response.status_code in (404, 405, 501):
                    log.info("%s/tokenize is not served: token counts are estimates", self.root_url)
                    self._tokenize_ok = False
                elif response.status_code == 200:
                    try:
                        count = response.json().get("count")
                    except (ValueError, AttributeError):
                        count = None
                    if isinstance(count, int):
                        self._tokenize_ok = True
                        return count
        return estimate_tokens(messages)

    async def probe(self) -> ProbeResult:
        """What the endpoint serves, for `doctor` and pre-flight checks. Never raises."""
        s = self._settings
        result = ProbeResult(base_url=self.base_url, reachable=False, model=s.model, sub_model=s.effective_sub_model)
        try:
            started = time.perf_counter()
            status, cards, error = await self._fetch_models()
            result.latency_s = time.perf_counter() - started
            if status is None:
                result.error = str(error)
                return result
            result.reachable = True
            if status in (401, 403):
                result.error = str(key_refused(f"{self.base_url}/models", status))
            elif cards is not None:
                self._cards = cards
                result.models = [c["id"] for c in cards]
                result.model_served = s.model in result.models
                result.sub_model_served = s.effective_sub_model in result.models
                result.max_model_len = window_from_cards(cards, s.model)
                missing = [m for m in dict.fromkeys([s.model, s.effective_sub_model]) if m not in result.models]
                if missing:
                    result.error = str(
                        model_not_served(missing[0], self.base_url, result.models, endpoint=self.base_url)
                    )
            result.health = await self._probe_health()
            result.tokenize = await self._probe_tokenize()
        except Exception as exc:  # a probe reports, it never fails its caller
            log.debug("probe failed", exc_info=True)
            result.error = result.error or f"probe of {self.base_url} failed: {exc!r}"
        return result

    async def _probe_health(self) -> bool | None:
        try:
            response = await self._client().request("GET", f"{self.root_url}/health", timeout_s=_DISCOVERY_TIMEOUT_S)
        except HttpError:
            return False
        return None if response.status_code in (404, 405) else response.is_success

    async def _probe_tokenize(self) -> bool | None:
        try:
            response = await self._client().request(
                "POST",
                f"{self.root_url}/tokenize",
                timeout_s=_DISCOVERY_TIMEOUT_S,
                json_body=encode_json(
                    {
                        "model": self._settings.model,
                        "messages": [{"role": "user", "content": "hi"}],
                        "add_generation_prompt": True,
                    }
                ),
            )
        except HttpError:
            return None
        if response.status_code in (404, 405, 501):
            self._tokenize_ok = False
            return False
        return True if response.status_code == 200 else None

    async def check_model(self) -> None:
        """Fail fast, with the fix, when the endpoint is down or does not serve the models."""
        s = self._settings
        status, cards, error = await self._fetch_models()
        if isinstance(error, LMConnectionError):
            raise error
        url = f"{self.base_url}/models"
        if status in (401, 403):
            raise key_refused(url, status)
        if status is not None and status >= 500:
            raise LMServerError(
                f"{url} answered HTTP {status}.",
                "Check the server's log; vLLM answers 500 when its engine died.",
                endpoint=url,
                status=status,
            )
        if cards is None:
            return  # no /v1/models (or not JSON): nothing to check against, the first call will tell
        self._cards = cards
        served = [c["id"] for c in cards]
        for name in dict.fromkeys([s.model, s.effective_sub_model]):
            if name not in served:
                raise model_not_served(name, self.base_url, served, endpoint=url)
