"""What one endpoint serves: its /v1/models cards (cached), each model's window, whether the
window is real or the 16384 fallback. Discovery failing is never fatal."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio

from rlm_mcp.lm.discovery import model_cards, serves_props, window_from_cards, window_from_props
from rlm_mcp.lm.endpoint import Endpoint
from rlm_mcp.lm.errors import listing_unusable, unreachable
from rlm_mcp.lm.http import HttpError
from rlm_mcp.lm.server_kind import guess_server_kind
from rlm_mcp.ports.chat import DEFAULT_WINDOW, LMError

log = logging.getLogger("rlm_mcp.lm")

DISCOVERY_TIMEOUT_S = 10.0
_RETRY_AFTER_FAILURE_S = 30.0  # after a failed /v1/models, ask again no sooner than this

Listing = tuple[int | None, list[dict[str, Any]] | None, str | LMError | None]


class ModelCatalog:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._lock: anyio.Lock | None = None  # anyio primitives bind to the running loop: made on first use
        self._cards: list[dict[str, Any]] | None = None
        self._failed_at: float | None = None
        self._windows: dict[str, int] = {}
        self._known: set[str] = set()  # windows the server itself reported

    @property
    def kind(self) -> str | None:
        """The server's kind ("vLLM", "Ollama", ...) as far as the address and cards tell."""
        return guess_server_kind(self.endpoint.base_url, self._cards)

    def unreachable(self, exc: Exception) -> LMError:
        c = self.endpoint.config
        return unreachable(c.label, c.base_url, self.kind, c.setting, str(exc) or type(exc).__name__)

    async def fetch(self) -> Listing:
        """GET /v1/models once: (HTTP status, None when unreachable; cards or None; the problem)."""
        url = f"{self.endpoint.base_url}/models"
        try:
            response = await self.endpoint.http().request("GET", url, timeout_s=DISCOVERY_TIMEOUT_S)
        except HttpError as exc:
            return None, None, self.unreachable(exc)
        if response.status_code != 200:
            return response.status_code, None, listing_unusable(url, response.status_code)
        try:
            payload = response.json()
        except ValueError:
            return 200, None, listing_unusable(url, 200)
        return 200, model_cards(payload), None

    def remember(self, cards: list[dict[str, Any]]) -> None:
        self._cards, self._failed_at = cards, None

    async def cards(self, fresh: bool = False) -> list[dict[str, Any]] | None:
        """The cards (cached; `fresh` asks again); None when the endpoint lists none."""
        if self._lock is None:
            self._lock = anyio.Lock(fast_acquire=True)
        async with self._lock:
            if self._cards is not None and not fresh:
                return self._cards
            if (
                not fresh
                and self._failed_at is not None
                and time.monotonic() - self._failed_at < _RETRY_AFTER_FAILURE_S
            ):
                return None
            _, cards, error = await self.fetch()
            if cards is None:
                log.info("model discovery failed (%s)", error)
                self._failed_at = time.monotonic()
                return None
            self.remember(cards)
            return cards

    async def served_ids(self, fresh: bool = False) -> list[str] | None:
        cards = await self.cards(fresh=fresh)
        return None if cards is None else [c["id"] for c in cards]

    async def window(self, model: str) -> int:
        """The model's window: the setting, else /v1/models (or llama.cpp's /props), else 16384."""
        if self.endpoint.config.max_model_len:
            return self.endpoint.config.max_model_len
        if model in self._windows:
            return self._windows[model]
        cards = await self.cards()
        found = window_from_cards(cards, model) if cards else None
        if found is None and serves_props(cards):
            found = await self._props_window()
        if found is not None:
            self._known.add(model)
        else:
            log.info("no window found for model '%s' at %s: assuming %d", model, self.endpoint.base_url, DEFAULT_WINDOW)
            if cards is None:
                return DEFAULT_WINDOW  # not cached: discovery may work later
            found = DEFAULT_WINDOW
        self._windows[model] = found
        return found

    async def window_known(self, model: str) -> bool:
        if self.endpoint.config.max_model_len:
            return True
        await self.window(model)
        return model in self._known

    async def _props_window(self) -> int | None:
        try:
            response = await self.endpoint.http().request(
                "GET", f"{self.endpoint.root_url}/props", timeout_s=DISCOVERY_TIMEOUT_S
            )
            return window_from_props(response.json()) if response.status_code == 200 else None
        except (HttpError, ValueError):
            return None
