"""Checking an endpoint before work: the pre-flight check of a run (fail fast, with the fix) and
`doctor`'s probe (report everything, never raise). Both name the endpoint they checked."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from rlm_mcp.lm import errors
from rlm_mcp.lm.catalog import DISCOVERY_TIMEOUT_S, ModelCatalog
from rlm_mcp.lm.counting import TokenCounter
from rlm_mcp.lm.discovery import ProbeResult, window_from_cards
from rlm_mcp.lm.http import HttpError
from rlm_mcp.ports.chat import LMConnectionError

log = logging.getLogger("rlm_mcp.lm")


def _model_setting(endpoint_name: str, model: str, root_model: str) -> str:
    if endpoint_name == "sub":
        return "RLM_MCP_SUB_MODEL"
    return "RLM_MCP_MODEL" if model == root_model else "RLM_MCP_SUB_MODEL"


async def check_models(catalog: ModelCatalog, required: Sequence[str], root_model: str) -> None:
    """Raise the `LMError` that says what to fix when the endpoint is down, refuses the key,
    fails, or does not serve one of `required`. An endpoint without /v1/models passes."""
    endpoint = catalog.endpoint
    config = endpoint.config
    status, cards, error = await catalog.fetch()
    if isinstance(error, LMConnectionError):
        raise error
    url = f"{endpoint.base_url}/models"
    if status in (401, 403):
        raise errors.key_refused(url, status, key_setting=config.key_setting)
    if status is not None and status >= 500:
        raise errors.listing_failed(url, status)
    if cards is None:
        return  # no /v1/models (or not JSON): nothing to check against, the first call will tell
    catalog.remember(cards)
    served = [c["id"] for c in cards]
    for name in dict.fromkeys(required):
        if name not in served:
            setting = _model_setting(config.name, name, root_model)
            raise errors.model_not_served(name, endpoint.base_url, served, endpoint=url, model_setting=setting)


async def probe(
    catalog: ModelCatalog, counter: TokenCounter, *, model: str, sub_model: str, required: Sequence[str]
) -> ProbeResult:
    """What the endpoint serves, for `doctor`. Never raises."""
    endpoint = catalog.endpoint
    config = endpoint.config
    result = ProbeResult(
        base_url=endpoint.base_url, reachable=False, model=model, sub_model=sub_model, endpoint=config.name
    )
    try:
        started = time.perf_counter()
        status, cards, error = await catalog.fetch()
        result.latency_s = time.perf_counter() - started
        if status is None:
            result.error = str(error)
            return result
        result.reachable = True
        if status in (401, 403):
            result.error = str(
                errors.key_refused(f"{endpoint.base_url}/models", status, key_setting=config.key_setting)
            )
        elif cards is not None:
            catalog.remember(cards)
            result.models = [c["id"] for c in cards]
            result.model_served = model in result.models if model in required else None
            result.sub_model_served = sub_model in result.models if sub_model in required else None
            result.max_model_len = window_from_cards(cards, required[0] if required else model)
            missing = [m for m in dict.fromkeys(required) if m not in result.models]
            if missing:
                setting = _model_setting(config.name, missing[0], model)
                result.error = str(
                    errors.model_not_served(
                        missing[0], endpoint.base_url, result.models, endpoint=endpoint.base_url, model_setting=setting
                    )
                )
        result.kind = catalog.kind
        result.health = await _health(catalog)
        result.tokenize = await counter.probe(required[0] if required else model)
    except Exception as exc:  # a probe reports, it never fails its caller
        log.debug("probe failed", exc_info=True)
        result.error = result.error or errors.probe_failed(endpoint.base_url, exc)
    return result


async def _health(catalog: ModelCatalog) -> bool | None:
    try:
        response = await catalog.endpoint.http().request(
            "GET", f"{catalog.endpoint.root_url}/health", timeout_s=DISCOVERY_TIMEOUT_S
        )
    except HttpError:
        return False
    return None if response.status_code in (404, 405) else response.is_success
