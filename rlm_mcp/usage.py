"""LM usage: the tokens, calls and cost of a run tree, in total and by model.

The one shape of usage everywhere: the `run_end` event (`rlm_mcp.events`), the run record
(`rlm_mcp.ports.runs`), the tool results and eval. Like the events, it imports only the standard
library and pydantic, so every layer may use it.
"""

from __future__ import annotations

from typing import Any, Protocol

import pydantic
from pydantic import BaseModel, ConfigDict, Field


class Accounted(Protocol):
    """The counts of one LM call or of a bucket of them (a record, a `TokenCount`)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cached_prompt_tokens(self) -> int: ...
    @property
    def cost_usd(self) -> float | None: ...


class AccountedCall(Accounted, Protocol):
    """What `Usage.add_call` reads of one LM call's record: its counts and its model."""

    @property
    def model(self) -> str: ...


# The fields `TokenCount.absorb` always sets.
_COUNTS = frozenset({"prompt_tokens", "completion_tokens", "calls", "cached_prompt_tokens"})


class TokenCount(BaseModel):
    """Tokens and calls of one bucket (a run tree's total, or one model's share).

    `cached_prompt_tokens` (the part of `prompt_tokens` the server answered from its prefix
    cache) is written only when non-zero, so the JSON of a run without cache hits is the one
    every earlier version wrote and reads."""

    model_config = ConfigDict(extra="ignore")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cached_prompt_tokens: int = 0
    # USD by the price table (RLM_MCP_MODEL_PRICES) of the calls whose model has a price; None
    # when none had one (no cost is ever guessed). Written only when known.
    cost_usd: float | None = None

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def absorb(self, other: Accounted) -> None:
        """Add `other`'s counts to these (a cost stays None while neither side has one): another
        bucket's, or one call's (its record, which counts as one call)."""
        # Set as pydantic's own `__setattr__` sets a field of a model without validate_assignment
        # (the value in `__dict__`, the name in the fields set), without its dispatch per set:
        # twice per LM call (the total and the model's bucket), 200 calls in a sub-call batch.
        values, names = self.__dict__, self.__pydantic_fields_set__
        values["prompt_tokens"] += other.prompt_tokens
        values["completion_tokens"] += other.completion_tokens
        values["calls"] += other.calls if isinstance(other, TokenCount) else 1
        values["cached_prompt_tokens"] += other.cached_prompt_tokens
        names.update(_COUNTS)
        if other.cost_usd is not None:
            values["cost_usd"] = (values["cost_usd"] or 0.0) + other.cost_usd
            names.add("cost_usd")

    @pydantic.model_serializer(mode="wrap")
    def _omit_unused(self, handler: pydantic.SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.cached_prompt_tokens:
            data.pop("cached_prompt_tokens", None)
        if self.cost_usd is None:
            data.pop("cost_usd", None)
        return data

    def to_dict(self) -> dict[str, int]:
        return self.model_dump()


class Usage(BaseModel):
    """LM usage of a run tree, in total and by model: the one shape of usage everywhere (the
    `run_end` event, the run record, the tool results, eval). Its JSON is
    `{"total": {...}, "by_model": {model: {...}}}` with `TokenCount`'s fields."""

    model_config = ConfigDict(extra="ignore")

    total: TokenCount = Field(default_factory=TokenCount)
    by_model: dict[str, TokenCount] = Field(default_factory=dict)

    def add(
        self,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        calls: int = 1,
        cached_prompt_tokens: int = 0,
        cost_usd: float | None = None,
    ) -> None:
        """Count one LM call (or `calls` of them) of `model`; `cost_usd`: None when unpriced."""
        self._count(
            model,
            TokenCount(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                calls=calls,
                cached_prompt_tokens=cached_prompt_tokens,
                cost_usd=cost_usd,
            ),
        )

    def _count(self, model: str, counts: TokenCount) -> None:
        """Add `counts` to the total and to `model`'s bucket."""
        bucket = self.by_model.get(model)
        if bucket is None:
            bucket = self.by_model[model] = TokenCount()
        self.total.absorb(counts)
        bucket.absorb(counts)

    def add_call(self, call: AccountedCall) -> None:
        """Count one LM call as its record accounts it (`rlm_mcp.ports.chat.CallRecord`). Its
        counts are ints and its cost a float or None already: added as they are, with no
        `TokenCount` built and validated for them (one call per sub-call, 200 in a batch)."""
        bucket = self.by_model.get(call.model)
        if bucket is None:
            bucket = self.by_model[call.model] = TokenCount()
        self.total.absorb(call)
        bucket.absorb(call)

    def merge(self, other: Usage) -> None:
        """Add another tree's usage to this one."""
        for model, counts in other.by_model.items():
            self._count(model, counts)

    def copy_of(self) -> Usage:
        """An independent copy (a record or event keeps the counts of one moment). Each bucket
        holds only numbers, so a shallow copy of each is independent: what a deep `model_copy`
        gives, without its generic deep copy (a team worker copies the usage at every live
        summary it publishes, each front following the run at every one it applies)."""
        return Usage.model_construct(
            _fields_set=set(self.model_fields_set),
            total=self.total.model_copy(),
            by_model={model: counts.model_copy() for model, counts in self.by_model.items()},
        )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def of(cls, data: object) -> Usage:
        """From stored JSON; anything unreadable (a record of an old version without usage) is empty."""
        if isinstance(data, Usage):
            return data.copy_of()
        if not isinstance(data, dict) or not data:
            return cls()
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError:
            return cls()


__all__ = ["Accounted", "AccountedCall", "TokenCount", "Usage"]
