"""Which request field carries the completion budget: the one owner of that rule.

vLLM, llama.cpp, Ollama and LM Studio take `max_tokens` (llama.cpp ignores
`max_completion_tokens`); OpenAI's newer models refuse `max_tokens` with a 400 saying to use
`max_completion_tokens`. Setting `completion_tokens_field` (RLM_MCP_COMPLETION_TOKENS_FIELD):
- `auto` (default): send `max_tokens`; when an endpoint answers that 400, retry the request once
  with `max_completion_tokens` and keep using it for that endpoint and model;
- `max_tokens` or `max_completion_tokens`: always that field.
"""

from __future__ import annotations

import re
import threading
from typing import Literal

from rlm_mcp.config import CompletionTokensField

FieldName = Literal["max_tokens", "max_completion_tokens"]
FieldSetting = CompletionTokensField

# OpenAI: "Unsupported parameter: 'max_tokens' is not supported with this model. Use
# 'max_completion_tokens' instead."
_REFUSES_MAX_TOKENS = re.compile(
    r"max_tokens.{0,80}(unsupported|not supported)|unsupported parameter.{0,20}max_tokens", re.I
)


class CompletionLengthField:
    """Remembers, per endpoint and model, which field the endpoint takes."""

    def __init__(self, setting: FieldSetting, endpoint: str) -> None:
        self.setting = setting
        self.endpoint = endpoint
        self._switched: set[str] = set()  # models at this endpoint that refused max_tokens
        self._lock = threading.Lock()

    def field_for(self, model: str) -> FieldName:
        if self.setting != "auto":
            return self.setting
        # Read without the lock: a set's membership test is one atomic step (the lock orders the
        # adds), and this is asked once per LM call.
        return "max_completion_tokens" if model in self._switched else "max_tokens"

    def switch_after(self, model: str, sent: FieldName, status: int | None, message: str) -> bool:
        """After an error: True when the request should be sent again with `max_completion_tokens`
        (auto mode, `max_tokens` was sent, and the endpoint said it does not take it)."""
        if self.setting != "auto" or sent != "max_tokens" or status != 400 or not _REFUSES_MAX_TOKENS.search(message):
            return False
        with self._lock:
            self._switched.add(model)
        return True


def set_budget(body: dict[str, object], field: FieldName, max_tokens: int) -> dict[str, object]:
    """A copy of the request body with the budget under `field` (and not under the other)."""
    out = dict(body)  # a copy in C, then the two fields dropped: what a filtering loop gives, in a third of its time
    out.pop("max_tokens", None)
    out.pop("max_completion_tokens", None)
    out[field] = max(1, int(max_tokens))
    return out
