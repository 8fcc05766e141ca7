"""Reading what an endpoint serves: `/v1/models` cards, windows, and the probe result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlm_mcp.ports.chat import DEFAULT_WINDOW

__all__ = ["DEFAULT_WINDOW", "ProbeResult", "model_cards", "serves_props", "window_from_cards", "window_from_props"]


@dataclass
class ProbeResult:
    """What a probe of one endpoint learned (`LMClient.probes()`); `None` means "could not tell"
    (endpoint missing, or the model is not expected at this endpoint)."""

    base_url: str
    reachable: bool
    model: str
    sub_model: str
    models: list[str] | None = None  # ids listed by /v1/models; None when it is missing
    model_served: bool | None = None
    sub_model_served: bool | None = None
    max_model_len: int | None = None  # of the root model, as discovered (not the setting)
    health: bool | None = None  # GET {root}/health answered 2xx
    tokenize: bool | None = None  # POST {root}/tokenize exists
    error: str | None = None  # the first problem found, written for a person
    latency_s: float | None = None  # round trip of GET /v1/models
    details: dict[str, Any] = field(default_factory=dict)
    endpoint: str = "root"  # "root", or "sub" for a separate sub-call endpoint
    kind: str | None = None  # the server's kind where the address or cards tell ("vLLM", ...)

    @property
    def ok(self) -> bool:
        return (
            self.reachable
            and self.error is None
            and self.model_served is not False
            and self.sub_model_served is not False
        )

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["ok"] = self.ok
        return out


def model_cards(payload: Any) -> list[dict[str, Any]]:
    """The cards of a /v1/models answer (`{"data": [...]}`), tolerating odd shapes."""
    data = payload.get("data") if isinstance(payload, dict) else payload
    return [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)] if isinstance(data, list) else []


# Card fields that are the served window: vLLM's max_model_len, OpenRouter's context_length.
# (llama.cpp's meta.n_ctx_train is the training window, not the served one: see window_from_props.)
_WINDOW_FIELDS = ("max_model_len", "context_length")


def _card_window(card: dict[str, Any]) -> int | None:
    for name in _WINDOW_FIELDS:
        value = card.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def window_from_cards(cards: list[dict[str, Any]], model: str) -> int | None:
    """The window of `model`: its own, else its parent's (vLLM lists adapters with null and the
    base with the number), else the smallest window listed."""
    by_id = {c["id"]: c for c in cards}
    card = by_id.get(model)
    seen: set[str] = set()
    while card is not None and card["id"] not in seen:
        seen.add(card["id"])
        if (value := _card_window(card)) is not None:
            return value
        parent = card.get("parent")
        card = by_id.get(parent) if isinstance(parent, str) else None
    # Model not listed (or no window on its chain): the smallest window served is the safe guess.
    windows = [w for c in cards if (w := _card_window(c)) is not None]
    return min(windows) if windows else None


def serves_props(cards: list[dict[str, Any]] | None) -> bool:
    """llama.cpp's server (owned_by "llamacpp") reports its served window at GET /props."""
    return any(str(c.get("owned_by", "")).lower() == "llamacpp" for c in cards or [])


def window_from_props(payload: Any) -> int | None:
    """llama.cpp's /props: default_generation_settings.n_ctx, the window of one slot (what a
    request may use; -c divided by --parallel)."""
    settings = payload.get("default_generation_settings") if isinstance(payload, dict) else None
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
