"""Chat completions at one endpoint: the request body, the attempt loop with backoff, and the
classification of a failed reply into an `LMError` (messages from lm/errors.py).

Plain HTTP (aiohttp, see `rlm_mcp.lm.http`) rather than the `openai` SDK: we run our own retry
policy (the SDK's would stack under it), we need the raw status, headers and error body to
classify failures (context length, unknown model, Retry-After), and we must tolerate responses
the SDK's models reject or hide (no `usage`, `reasoning_content`, broken JSON).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import anyio

from rlm_mcp.events import CallRole
from rlm_mcp.lm import errors
from rlm_mcp.lm.catalog import ModelCatalog
from rlm_mcp.lm.endpoint import Endpoint
from rlm_mcp.lm.http import HttpError, HttpReply, HttpTimeout, HttpTransportError, encode_json
from rlm_mcp.lm.length_field import set_budget
from rlm_mcp.lm.responses import parse_completion, server_message
from rlm_mcp.lm.retry import TOTAL_SLEEP_CAP_S, backoff_s, retry_after_s, retryable_status
from rlm_mcp.lm.throttle import THROTTLE_STATUSES, THROTTLED_SLEEP_CAP_S, WAIT_OUT_STATUSES, Gate, Throttles
from rlm_mcp.observability import metrics
from rlm_mcp.ports.chat import CallRecord, Completion, LMError, LMRequestError

log = logging.getLogger("rlm_mcp.lm")

_CONTEXT_RE = re.compile(
    r"context length|context_length_exceeded|exceed_context_size|max_model_len|context window", re.I
)

# The headers of one attempt (a fresh X-Request-ID each time) and what to do with the answer's.
HeadersFor = Callable[[], dict[str, str]]
OnReply = Callable[[HttpReply], None]


class ChatCall(NamedTuple):
    """One chat completion as `Completions.complete` sends it: what the engine asked for
    (`ChatModel.complete`'s messages, model, budget and role) and how `LMClient` routes it. One
    value, so the client's call and the endpoint's signature do not each spell the list out.
    A named tuple: as immutable as a frozen dataclass, built without a `__setattr__` per field
    (one per LM call)."""

    messages: list[dict[str, str]]
    model: str
    max_tokens: int
    role: CallRole
    headers: HeadersFor
    on_reply: OnReply | None = None
    xargs: dict[str, Any] | None = None  # fields added to the body's `vllm_xargs` (over the extra body's)


class _Tally:
    """What one call's attempts cost besides the answer (the run log and the viewer show it):
    filled in by `_post`, also when it raises."""

    __slots__ = ("backoff_s", "queued_s", "retries", "throttled")

    def __init__(self) -> None:
        self.queued_s = 0.0  # waiting for a place (the endpoint's limit, the process's slots)
        self.retries = 0  # attempts after the first
        self.throttled = 0  # answers 429/503
        self.backoff_s = 0.0  # slept between attempts


class _Waits:
    """One call's waits so far, against the caps that end it (`Completions._delay`)."""

    __slots__ = ("attempt", "slept", "throttled_s", "turns")

    def __init__(self) -> None:
        self.attempt = 0  # failures other than "less load, please": those wait without counting
        self.turns = 0  # failed attempts of any kind
        self.slept = 0.0  # waited after counted failures (TOTAL_SLEEP_CAP_S)
        self.throttled_s = 0.0  # waited after 429s (THROTTLED_SLEEP_CAP_S)


def _tallied(completion: Completion, tally: _Tally) -> Completion:
    """`completion` with its retries accounted (only calls that retried pay for the copy)."""
    record = replace(completion.record, retries=tally.retries, throttled=tally.throttled, backoff_s=tally.backoff_s)
    return replace(completion, record=record)


async def _take(slots: anyio.Semaphore) -> None:
    """One of the process's slots: at once when one is free (no await: anyio's `acquire` checks
    for cancellation first, walking the task's cancel scopes, a sub-call's eleven nested ones,
    where the request just after is a checkpoint anyway), else waiting in line for one."""
    try:
        slots.acquire_nowait()
    except anyio.WouldBlock:
        await slots.acquire()


class Completions:
    def __init__(
        self,
        endpoint: Endpoint,
        catalog: ModelCatalog,
        slots: Callable[[], anyio.Semaphore],
        throttles: Throttles,
        *,
        retries: int,
        backoff_base_s: float,
    ) -> None:
        self.endpoint = endpoint
        self.catalog = catalog
        self._slots = slots
        self._throttles = throttles
        self._retries = max(0, retries)
        self._backoff_base_s = backoff_base_s

    async def complete(self, call: ChatCall) -> Completion:
        """One non-streamed chat completion, retried on transient failures.

        Raises an `LMError`; its `record` is the failed call as accounted.
        """
        messages, model, max_tokens, role = call.messages, call.model, call.max_tokens, call.role
        headers, on_reply, xargs = call.headers, call.on_reply, call.xargs
        config = self.endpoint.config
        base: dict[str, Any] = {**config.extra_body, "model": model, "messages": messages, "stream": False}
        if xargs:
            given = base.get("vllm_xargs")
            base["vllm_xargs"] = {**(given if isinstance(given, dict) else {}), **xargs}
        base.pop("user", None)  # never a routing key: routers hash it (see lm/routing.py)
        length_field = self.endpoint.length_field
        field = length_field.field_for(model)
        body = set_budget(base, field, max_tokens)
        started = time.perf_counter()
        gate = self._throttles.gate(config.name, self.endpoint.base_url, model)
        tally = _Tally()
        try:
            try:
                response = await self._post(body, model, tally, headers, gate)
            except LMRequestError as refused:
                if not length_field.switch_after(model, field, refused.status, refused.server_message or ""):
                    raise
                log.info("%s refused max_tokens for model %s; using max_completion_tokens", config.base_url, model)
                body = set_budget(base, "max_completion_tokens", max_tokens)
                tally.retries += 1
                response = await self._post(body, model, tally, headers, gate)
            if on_reply is not None:
                on_reply(response)
            completion = parse_completion(response, messages, model, role, started, tally.queued_s, config.setting)
            if tally.retries:
                completion = _tallied(completion, tally)
            elif gate.queueing is not None:  # a clean first answer: its latency is a load signal
                record = completion.record
                gate.answered_in(record.latency_s, record.prompt_tokens, record.completion_tokens)
        except LMError as err:
            err.record = CallRecord(
                model,
                0,
                0,
                time.perf_counter() - started - tally.queued_s,
                "error",
                role,
                error=str(err),
                queued_s=tally.queued_s,
                retries=tally.retries,
                throttled=tally.throttled,
                backoff_s=tally.backoff_s,
            )
            raise
        return completion

    async def _post(
        self, body: dict[str, Any], model: str, tally: _Tally, headers: HeadersFor, gate: Gate
    ) -> HttpReply:
        url = f"{self.endpoint.base_url}/chat/completions"
        config = self.endpoint.config
        spent = _Waits()
        payload = encode_json(body)
        while True:
            wait: float | None = None
            # A place is held for one attempt: a call backing off after a failure must not starve
            # others. An answer asking for less load is the exception (below).
            asked = time.perf_counter()
            given = gate.try_acquire()
            sent_at = given if given is not None else await gate.acquire()
            try:
                slots = self._slots()
                await _take(slots)
                try:
                    tally.queued_s += time.perf_counter() - asked
                    try:
                        response = await self.endpoint.http().request("POST", url, json_body=payload, headers=headers())
                    except HttpTimeout as exc:
                        failure: LMError = errors.timed_out(url, model, str(exc), self.endpoint.request_timeout_s)
                    except HttpTransportError as exc:
                        failure = self.catalog.unreachable(exc)
                    except HttpError as exc:  # a corrupt body (bad encoding), broken framing, ...
                        raise errors.unreadable(url, model, str(exc), config.setting) from exc
                    else:
                        if response.status_code < 400:
                            gate.answered()
                            return response
                        failure = await self._status_error(response, url, model, spent.attempt + 1)
                        wait = retry_after_s(response)
                finally:
                    slots.release()
                less_load = failure.status in THROTTLE_STATUSES
                if less_load:  # fewer in flight here (and, shared, in the team)
                    assert failure.status is not None
                    tally.throttled += 1
                    if gate.throttled(failure.status, sent_at):
                        await self._throttles.publish_cut(gate)
                delay = self._delay(failure, wait, spent, tally)
                if less_load:
                    # The endpoint had no room for this call, so it has none for the next one in
                    # line either: the place stays taken while this call waits. Handed on at once,
                    # it sent the next call straight into the same refusal, one after another
                    # through the whole queue, as fast as the endpoint could refuse them.
                    await anyio.sleep(delay)
            finally:
                gate.release()
            if not less_load:
                await anyio.sleep(delay)

    def _delay(self, failure: LMError, wait: float | None, spent: _Waits, tally: _Tally) -> float:
        """How long the call waits before its next attempt, counted; raises `failure` when the call
        gives up instead."""
        spent.turns += 1
        if waited_out := (failure.status in WAIT_OUT_STATUSES):
            # "Too many requests": this call waits its turn again however long the storm
            # lasts; the run's deadline, not a count of attempts, decides when to give up.
            delay = wait if wait is not None else backoff_s(min(spent.turns, 6), self._backoff_base_s)
            if spent.throttled_s + delay > THROTTLED_SLEEP_CAP_S:
                raise failure
            spent.throttled_s += delay
        else:
            if not failure.retryable or spent.attempt >= self._retries:
                raise failure
            delay = wait if wait is not None else backoff_s(spent.attempt, self._backoff_base_s)
            if spent.slept + delay > TOTAL_SLEEP_CAP_S:
                raise failure
            spent.slept += delay
            spent.attempt += 1
        tally.retries += 1
        tally.backoff_s += delay
        metrics.lm_retry(self.endpoint.config.name, errors.error_kind(failure))
        log.log(
            logging.INFO if waited_out else logging.WARNING,
            "LM call failed (attempt %d), retrying in %.2f s: %s",
            spent.turns,
            delay,
            failure,
        )
        return delay

    async def _status_error(self, response: HttpReply, url: str, model: str, attempts: int) -> LMError:
        status, message = response.status_code, server_message(response)
        config = self.endpoint.config
        if retryable_status(status):
            return errors.server_busy(url, status, model, attempts, message)
        if status in (400, 413, 422) and _CONTEXT_RE.search(message + response.text[:2000]):
            window_setting = "RLM_MCP_MAX_MODEL_LEN" if config.name == "root" else "RLM_MCP_SUB_MAX_MODEL_LEN"
            return errors.too_long(url, status, model, message, window_setting)
        if status == 404:
            if "model" in message.lower():
                served = await self.catalog.served_ids(fresh=True)
                return errors.model_not_served(model, config.base_url, served, endpoint=url, server_message=message)
            return errors.path_missing(url, message, config.setting)
        if status in (401, 403):
            return errors.key_refused(url, status, server_message=message, key_setting=config.key_setting)
        body_setting = "RLM_MCP_EXTRA_BODY" if config.name == "root" else "RLM_MCP_SUB_EXTRA_BODY"
        return errors.request_refused(url, status, model, message, body_setting)
