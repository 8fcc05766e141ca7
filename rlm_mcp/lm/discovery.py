"""Reading what an endpoint serves: `/v1/models` cards, windows, and the probe result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_WINDOW = 16384  # what the rlm-v0.1 adapter was trained with


@dataclass
class ProbeResult:
    """What `LMClient.probe()` learned; `None` means "could not tell" (endpoint missing)."""

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

    @property
    def ok(self) -> bool:
        return self.reachable and self.model_served is not False and self.sub_model_served is not False

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["ok"] = self.ok
        return out


def model_cards(payload: Any) -> list[dict[str, Any]]:
    """The cards of a /v1/models answer (`{"data": [...]}`), tolerating odd shapes."""
    data = payload.get("data") if isinstance(payload, dict) else payload
    return [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)] if isinstance(data, list) else []


def window_from_cards(cards: list[dict[str, Any]], model: str) -> int | None:
    """The window of `model`: its own max_model_len, else its parent's (vLLM lists adapters with
    null and the base with the number), else the only/smallest window listed."""
    by_id = {c["id"]: c for c in cards}
    card = by_id.get(model)
    seen: set[str] = set()
    while card is not None and card["id"] not in seen:
        seen.add(card["id"])
        value = card.get("max_model_len")
        if isinstance(value, int) and value > 0:
            return value
        parent = card.get("parent")
        card = by_id.get(parent) if isinstance(parent, str) else None
    # Model not listed (or no window on its chain): the smallest window served is the safe guess.
    windows = [c["max_model_len"] for c in cards if isinstance(c.get("max_model_len"), int) and c["max_model_len"] > 0]
    return min(windows) if windows else None
