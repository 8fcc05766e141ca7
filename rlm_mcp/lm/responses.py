"""Reading chat-completion responses: the text, how it ended, and its exact usage."""

from __future__ import annotations

import logging
import time
from typing import Any

from rlm_mcp.events import CallRole
from rlm_mcp.lm.errors import no_choices, not_json
from rlm_mcp.lm.http import HttpReply
from rlm_mcp.lm.tokens import content_text, estimate_text_tokens, estimate_tokens, reported_count
from rlm_mcp.ports.chat import CallRecord, Completion
from rlm_mcp.ports.text import valid_text

log = logging.getLogger("rlm_mcp.lm")


def server_message(response: HttpReply) -> str:
    """The error text of a response: OpenAI/vLLM `error.message`, FastAPI `detail`, or the body."""
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:500] or f"HTTP {response.status_code}"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("error", "detail", "message"):
            if isinstance(data.get(key), str) and data[key]:
                return str(data[key])
    return str(data)[:500]


def parse_completion(
    response: HttpReply,
    messages: list[dict[str, str]],
    model: str,
    role: CallRole,
    started: float,
    queued_s: float,
    setting: str = "RLM_MCP_BASE_URL",
) -> Completion:
    """A 200 answer as a Completion; tolerant of what real servers omit, strict about the rest.
    `setting` names the variable that sets this endpoint's address (for the fix)."""
    url = response.url
    try:
        data = response.json()
    except ValueError:
        raise not_json(url, response.status_code, response.text, setting) from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise no_choices(url, response.status_code, data, setting)
    choice = choices[0]
    raw_message = choice.get("message")
    message: dict[str, Any] = raw_message if isinstance(raw_message, dict) else {}
    text = content_text(message.get("content"))
    if not text:
        # Reasoning parsers move everything to `reasoning_content` when no answer follows.
        for key in ("reasoning_content", "reasoning"):
            value = message.get(key)
            if isinstance(value, str) and value:
                text = value
                break
    text = valid_text(text)
    usage = data.get("usage")
    reported = (usage.get("prompt_tokens"), usage.get("completion_tokens")) if isinstance(usage, dict) else (None, None)
    prompt_tokens, completion_tokens = reported_count(reported[0]), reported_count(reported[1])
    estimated = prompt_tokens is None or completion_tokens is None
    if prompt_tokens is None or completion_tokens is None:
        if reported != (None, None):  # a server that counts wrong: said once per reply, never trusted
            shown = ", ".join(f"{str(v)[:20]}{'...' if len(str(v)) > 20 else ''}" for v in reported)
            log.warning("%s reported token counts that are not counts (%s): estimating them", url, shown)
        else:
            log.debug("no usage in the response of %s: estimating", url)
        prompt_tokens, completion_tokens = estimate_tokens(messages), estimate_text_tokens(text)
    finish = choice.get("finish_reason")
    record = CallRecord(
        model,
        prompt_tokens,
        completion_tokens,
        time.perf_counter() - started - queued_s,
        "ok",
        role,
        estimated=estimated,
        queued_s=queued_s,
        cached_prompt_tokens=0 if estimated else cached_tokens(usage),
    )
    return Completion(text, finish if isinstance(finish, str) else None, record)


def cached_tokens(usage: object) -> int:
    """The prompt tokens the server answered from its prefix cache (OpenAI's and vLLM's
    `usage.prompt_tokens_details.cached_tokens`); 0 when it does not say."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = reported_count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return cached or 0
