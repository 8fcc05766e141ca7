"""Counting prompt tokens at one endpoint: POST {root}/tokenize when served, else an estimate."""

from __future__ import annotations

import logging
from typing import Any

from rlm_mcp.lm.catalog import DISCOVERY_TIMEOUT_S
from rlm_mcp.lm.endpoint import Endpoint
from rlm_mcp.lm.http import HttpError, encode_json
from rlm_mcp.lm.tokens import estimate_tokens, reported_count

log = logging.getLogger("rlm_mcp.lm")

_NOT_SERVED = (404, 405, 501)


class TokenCounter:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.served: bool | None = None  # None until /tokenize answered one way or the other

    def _body(self, messages: list[dict[str, str]], model: str) -> bytes:
        body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
        extra = self.endpoint.config.extra_body
        if "chat_template_kwargs" in extra:  # the same template the completion will render
            body["chat_template_kwargs"] = extra["chat_template_kwargs"]
        return encode_json(body)

    async def count(self, messages: list[dict[str, str]], *, model: str) -> int:
        """Prompt tokens as the chat template sees them: /tokenize when served, else an over-estimate."""
        if self.served is not False:
            url = f"{self.endpoint.root_url}/tokenize"
            try:
                response = await self.endpoint.http().request(
                    "POST", url, json_body=self._body(messages, model), timeout_s=DISCOVERY_TIMEOUT_S
                )
            except HttpError as exc:
                log.debug("/tokenize failed (%r): estimating", exc)
            else:
                if response.status_code in _NOT_SERVED:
                    log.info("%s is not served: token counts are estimates", url)
                    self.served = False
                elif response.status_code == 200:
                    try:
                        count = reported_count(response.json().get("count"))
                    except (ValueError, AttributeError):
                        count = None
                    if count is not None:
                        self.served = True
                        return count
        return estimate_tokens(messages)

    async def probe(self, model: str) -> bool | None:
        """Whether /tokenize is served (for doctor); None when it could not tell."""
        try:
            response = await self.endpoint.http().request(
                "POST",
                f"{self.endpoint.root_url}/tokenize",
                json_body=self._body([{"role": "user", "content": "hi"}], model),
                timeout_s=DISCOVERY_TIMEOUT_S,
            )
        except HttpError:
            return None
        if response.status_code in _NOT_SERVED:
            self.served = False
            return False
        return True if response.status_code == 200 else None
