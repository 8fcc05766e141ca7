"""What the scripted server answers, as vLLM 0.33 shapes it: the model cards, the window's
refusals, a scripted fault's reply, and a completion's body.

Pure functions of the script and the request: the server (`scripted_lm.ScriptedLM`) handles the
connections, the request log and the order of the checks; the rules of each answer are here.

Window, as vLLM 0.33: a prompt over max_model_len is a 400 ("This model's maximum context
length is N tokens. However, your prompt contains M input tokens, ..."); max_tokens over
max_model_len is a 400 ("max_tokens=X cannot be greater than max_model_len=N. ..."); when
prompt + max_tokens overflows, max_tokens is clamped to what is left, and a reply longer than
the (clamped) max_tokens is cut, with finish_reason "length". An unknown model is a 404
("The model `X` does not exist.").
"""

from __future__ import annotations

import json
import time
from typing import Any

from rlm_mcp.testing._http import Response, error_response, json_response
from rlm_mcp.testing.endpoints import Endpoint
from rlm_mcp.testing.script import Fault, Script, count_prompt_tokens, count_text_tokens


def model_cards(script: Script) -> list[dict[str, Any]]:
    """`GET /v1/models`: the base model with its window, then each adapter (window null)."""
    s, now = script, int(time.time())
    card = {"object": "model", "created": now, "owned_by": "vllm", "permission": []}
    base = {**card, "id": s.base_model, "root": s.base_model, "parent": None, "max_model_len": s.max_model_len}
    adapters = [
        {**card, "id": name, "root": f"/adapters/{name}", "parent": s.base_model, "max_model_len": None}
        for name in [s.model, *s.extra_models]
        if name != s.base_model
    ]
    return [base, *adapters]


def unknown_model(script: Script, endpoint: Endpoint | None, model: Any) -> Response | None:
    """vLLM's 404 for a model it does not serve; None when it does (or the endpoint never checks)."""
    if model is None or model in script.served_models() or (endpoint and not endpoint.checks_model):
        return None
    return error_response(404, f"The model `{model}` does not exist. Valid aliases: {[script.base_model]}.", "model")


def tokenize(script: Script, endpoint: Endpoint | None, body: bytes) -> Response:
    """`POST /tokenize`: the count of a prompt (messages) or a text, in the script's tokens."""
    try:
        data = json.loads(body)
    except ValueError:
        return error_response(400, "invalid JSON body")
    if (missing := unknown_model(script, endpoint, data.get("model"))) is not None:
        return missing
    if isinstance(data.get("messages"), list):
        count = count_prompt_tokens(data["messages"], bool(data.get("add_generation_prompt", True)))
    else:
        count = count_text_tokens(str(data.get("prompt", "")))
    return json_response(200, {"count": count, "max_model_len": script.max_model_len, "tokens": list(range(count))})


def window_refusal(window: int, prompt_tokens: int, field: str, max_tokens: Any) -> Response | None:
    """vLLM's 400 for a prompt over the window, or for `max_tokens` over it; None when it fits."""
    if prompt_tokens > window:
        return error_response(
            400,
            f"This model's maximum context length is {window} tokens. However, your prompt "
            f"contains {prompt_tokens} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
        )
    if isinstance(max_tokens, int) and max_tokens > window:
        return error_response(
            400,
            f"{field}={max_tokens} cannot be greater than max_model_len={window}. Please request fewer output tokens.",
            field,
        )
    return None


def faulted(fault: Fault) -> Response | str | None:
    """What a scripted fault sends instead of a completion: a response, "dropped" (the
    connection closes unanswered), or None when the fault only delays or shapes the reply."""
    if fault.drop:
        return "dropped"
    if fault.malformed:
        if fault.malformed == "no_choices":
            return json_response(200, {"id": "chatcmpl-x", "object": "chat.completion"})
        return 200, b'{"id": "chatcmpl-x", "choices": [', {"Content-Type": "application/json"}
    if (status := fault.error_status()) is not None:
        return _fault_response(fault, status)
    return None


def _fault_response(fault: Fault, status: int) -> Response:
    headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
    if isinstance(fault.body, dict):
        return json_response(status, fault.body, headers)
    message = fault.body or {404: "Not Found", 429: "Too many requests"}.get(
        status, "The server had an error while processing your request."
    )
    status, payload, base = error_response(status, message)
    return status, payload, {**base, **headers}


def completion(
    script: Script,
    data: dict[str, Any],
    text: str,
    *,
    ident: int,
    finish: str,
    prompt_tokens: int,
    fault: Fault | None,
) -> Response:
    """A chat completion carrying `text` (in `reasoning_content` when the script or the fault
    says so), with usage unless either turns it off."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if script.reasoning_content or (fault is not None and fault.reasoning_only):
        message = {"role": "assistant", "content": "", "reasoning_content": text}
    completion_tokens = count_text_tokens(text)
    out: dict[str, Any] = {
        "id": f"chatcmpl-{ident}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": data.get("model") or script.base_model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }
    if script.usage and not (fault is not None and fault.no_usage):
        out["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if fault is not None and fault.usage is not None:
            out["usage"] = fault.usage
    return json_response(200, out)
