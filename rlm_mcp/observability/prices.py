"""The cost of an LM call by the operator's price table (RLM_MCP_MODEL_PRICES).

Prices are USD per million tokens: `input` for prompt tokens the server computed, `cached_input`
for those it answered from its prefix cache (the `input` price when the table gives none),
`output` for completion tokens. A model the table does not list has no cost: None, never a
guess from another model or a public list.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_mcp.config import ModelPrice

__all__ = ["call_cost"]

_PER = 1_000_000


def call_cost(
    prices: Mapping[str, ModelPrice], model: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int
) -> float | None:
    """USD of one call of `model`, or None when the table has no price for it."""
    price = prices.get(model)
    if price is None:
        return None
    cached = min(max(cached_prompt_tokens, 0), prompt_tokens)
    cached_price = price.input if price.cached_input is None else price.cached_input
    return ((prompt_tokens - cached) * price.input + cached * cached_price + completion_tokens * price.output) / _PER
