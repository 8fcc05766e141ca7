"""`LMClient`: the engine's `ChatModel`, routing each call to its endpoint.

- Root calls (every root turn, at every depth: a child RLM's turns too) go to the root endpoint
  and carry the run id as the session key (lm/routing.py).
- Sub-calls (`llm_query`, `llm_query_batched`, `rlm_query` at the depth limit) go to the
  sub-call endpoint; a sub-call naming another allowed model goes to the endpoint that serves
  it (the sub-call endpoint when it lists it or lists nothing, else the root endpoint when that
  lists it).
- Window discovery, token counting, the completion-length field and retries are per endpoint
  (and per model), in `catalog`, `counting`, `length_field` and `completions`; the pre-flight
  check and doctor's probe in `probe`. This module only wires them and routes.

One HTTP pool per endpoint for every call of the process; one concurrency limit
(`RLM_MCP_MAX_CONCURRENT_LM_CALLS`) over both, and under it an adaptive one per endpoint and
model (lm/throttle.py) that falls when the endpoint answers 429/503.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import anyio

from rlm_mcp.config import LMSettings, RoutingSettings
from rlm_mcp.events import CallRole
from rlm_mcp.lm.catalog import ModelCatalog
from rlm_mcp.lm.completions import ChatCall, Completions
from rlm_mcp.lm.counting import TokenCounter
from rlm_mcp.lm.discovery import ProbeResult
from rlm_mcp.lm.endpoint import Endpoint, endpoint_configs
from rlm_mcp.lm.errors import error_kind
from rlm_mcp.lm.http import HttpReply
from rlm_mcp.lm.probe import check_models, probe
from rlm_mcp.lm.router_sessions import finish_sessions, run_sessions
from rlm_mcp.lm.routing import RoutingKeys, program_hints
from rlm_mcp.lm.throttle import Throttles
from rlm_mcp.observability import metrics, tracing
from rlm_mcp.observability.prices import call_cost
from rlm_mcp.ports.chat import CallRecord, Completion, LMError

log = logging.getLogger("rlm_mcp.lm")


@dataclass
class _Parts:
    endpoint: Endpoint
    catalog: ModelCatalog
    counter: TokenCounter
    completions: Completions


class LMClient:
    """Talks to the root endpoint and, when one is set, the sub-call endpoint. Connects lazily."""

    def __init__(
        self, settings: LMSettings, *, routing: RoutingSettings | None = None, backoff_base_s: float | None = None
    ) -> None:
        self.settings = settings
        # anyio primitives bind to the running event loop, so the limiter is made on first use.
        self._limiter: anyio.Semaphore | None = None
        # Tests shorten the backoff; 0.5 s doubling is the SDKs' convention.
        backoff = 0.5 if backoff_base_s is None else backoff_base_s
        root_config, sub_config = endpoint_configs(settings)
        # Per endpoint and model, adapting to 429/503 answers; the fixed limit is their ceiling.
        self.throttles = Throttles(settings.max_concurrent_lm_calls, queueing_cut=settings.lm_queueing_cut)

        def parts(config: Any) -> _Parts:
            endpoint = Endpoint(config, request_timeout_s=settings.request_timeout_s)
            catalog = ModelCatalog(endpoint)
            completions = Completions(
                endpoint, catalog, self._slots, self.throttles, retries=settings.lm_retries, backoff_base_s=backoff
            )
            return _Parts(endpoint, catalog, TokenCounter(endpoint), completions)

        self._root = parts(root_config)
        self._sub = parts(sub_config) if sub_config is not None else self._root
        self.routing_settings = routing if routing is not None else RoutingSettings()
        self.routing = RoutingKeys(
            affinity=settings.session_affinity,
            session_header=settings.session_header,
            router_sessions=self.routing_settings.router_sessions,
            sub_sessions=self.routing_settings.router_sub_sessions,
        )
        self.base_url = self._root.endpoint.base_url
        self.sub_base_url = self._sub.endpoint.base_url

    @property
    def separate_sub_endpoint(self) -> bool:
        return self._sub is not self._root

    # --- plumbing ---------------------------------------------------------------------------
    def _slots(self) -> anyio.Semaphore:
        if self._limiter is None:
            self._limiter = anyio.Semaphore(max(1, self.settings.max_concurrent_lm_calls), fast_acquire=True)
        return self._limiter

    async def aclose(self) -> None:
        await self._root.endpoint.aclose()
        await self._sub.endpoint.aclose()

    async def __aenter__(self) -> LMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- routing ----------------------------------------------------------------------------
    def _routed(self, role: CallRole, model: str) -> _Parts | None:
        """The endpoint of a call when its role or model alone decides it (every call to a
        single endpoint, every sub-call of the sub model); None when the catalogs must say."""
        if role == "root" or not self.separate_sub_endpoint:
            return self._root
        if model == self.settings.effective_sub_model:
            return self._sub
        return None

    async def _parts(self, role: CallRole, model: str) -> _Parts:
        parts = self._routed(role, model)
        if parts is not None:
            return parts
        # Another allowed model: the endpoint that lists it, the sub-call endpoint first.
        served = await self._sub.catalog.served_ids()
        if served is None or model in served:
            return self._sub
        root_served = await self._root.catalog.served_ids()
        return self._root if root_served is not None and model in root_served else self._sub

    # --- the ChatModel protocol -------------------------------------------------------------
    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        max_tokens: int,
        role: CallRole,
        session: str | None = None,
    ) -> Completion:
        """One chat completion. `session` is the run id the call is made in: a root call's
        routing key; a sub-call's run, keyed on only when routers count sessions (lm/routing.py).
        Raises an `LMError` whose `record` is the failed call as accounted."""
        # Routed without a coroutine when role or model decides (one per call saved).
        parts = self._routed(role, model) or await self._parts(role, model)
        key = session if role == "root" else None
        sub_of = session if role != "root" else None
        url = parts.endpoint.root_url

        def remember(reply: HttpReply) -> None:
            self.routing.remember(key, reply.headers)

        def headers() -> dict[str, str]:
            sent = self.routing.headers(key, sub_of=sub_of)
            self.routing.sent(session, url, sent)
            return tracing.inject_headers(sent)

        endpoint = parts.endpoint.config.name
        with tracing.lm_span(model=model, role=role, endpoint=endpoint, max_tokens=max_tokens) as span:
            try:
                completion = await parts.completions.complete(
                    ChatCall(
                        messages,
                        model=model,
                        max_tokens=max_tokens,
                        role=role,
                        headers=headers,
                        on_reply=remember if key is not None else None,
                        xargs=program_hints(key) if key is not None and self.routing_settings.program_hints else None,
                    )
                )
            except LMError as err:
                if err.record is not None:
                    self._observe(endpoint, err.record, error_kind(err))
                    tracing.lm_span_failed(span, error_kind(err))
                raise
            record = completion.record
            cost = call_cost(self.settings.model_prices, model, *_tokens(record))
            if cost is not None:
                record = replace(record, cost_usd=cost)
                completion = replace(completion, record=record)
            self._observe(endpoint, record, "ok")
            tracing.lm_span_done(span, record, completion.finish_reason)
            tracing.lm_content(span, messages, completion.text)
            return completion

    @staticmethod
    def _observe(endpoint: str, record: CallRecord, outcome: str) -> None:
        metrics.lm_call(
            endpoint,
            record.model,
            record.role,
            outcome,
            record.latency_s,
            record.queued_s,
            *_tokens(record),
        )
        if record.cost_usd is not None:
            metrics.lm_cost(record.model, record.role, record.cost_usd)
        if outcome != "ok":
            metrics.lm_error(endpoint, outcome)

    async def finish_sessions(self, run_id: str) -> int:
        """Tell the routers that the sessions of the run tree of `run_id` are over (lm/router_sessions.py):
        only when routers count sessions. Never raises; bounded by RLM_MCP_ROUTER_FINISH_TIMEOUT_S."""
        if not self.routing_settings.router_sessions:
            return 0
        sessions = run_sessions(run_id, self.routing, root=self._root.endpoint, sub=self._sub.endpoint)
        return await self._finish(sessions)

    async def session_done(self, session: str) -> None:
        """A child RLM ended: finish its own root session now (its tree's sub-call sessions end
        with the tree). Only when routers count sessions; never raises; bounded."""
        if not self.routing_settings.router_sessions:
            return
        await self._finish(self.routing.ledger.take_one(session))

    async def _finish(self, sessions: set[tuple[str, str]]) -> int:
        r = self.routing_settings
        return await finish_sessions(sessions, self._endpoints(), r.router_finish_timeout_s, api_key=r.router_api_key)

    def _endpoints(self) -> dict[str, Endpoint]:
        return {self._root.endpoint.root_url: self._root.endpoint, self._sub.endpoint.root_url: self._sub.endpoint}

    async def window(self, model: str, *, role: CallRole = "root") -> int:
        """The model's window at the endpoint its `role` calls go to. Never raises."""
        return await (await self._parts(role, model)).catalog.window(model)

    async def window_known(self, model: str, *, role: CallRole = "root") -> bool:
        """Whether `window(model)` is real (the setting or discovered) rather than the fallback."""
        return await (await self._parts(role, model)).catalog.window_known(model)

    async def count_tokens(self, messages: list[dict[str, str]], *, model: str, role: CallRole = "root") -> int:
        """Prompt tokens as that endpoint's chat template sees them (/tokenize, else an over-estimate)."""
        return await (await self._parts(role, model)).counter.count(messages, model=model)

    # --- checks -----------------------------------------------------------------------------
    def _required(self) -> list[tuple[_Parts, list[str]]]:
        s = self.settings
        if not self.separate_sub_endpoint:
            return [(self._root, [s.model, s.effective_sub_model])]
        return [(self._root, [s.model]), (self._sub, [s.effective_sub_model])]

    async def check_model(self) -> None:
        """Fail fast, naming the endpoint and the fix, when an endpoint is down or does not
        serve the models it is used for (the root model; the sub model at the sub endpoint)."""
        for parts, required in self._required():
            await check_models(parts.catalog, required, self.settings.model)

    async def probes(self) -> list[ProbeResult]:
        """One probe per endpoint (root first), for `doctor`. Never raises."""
        s = self.settings
        return [
            await probe(parts.catalog, parts.counter, model=s.model, sub_model=s.effective_sub_model, required=required)
            for parts, required in self._required()
        ]

    async def probe(self) -> ProbeResult:
        """The root endpoint's probe."""
        return (await self.probes())[0]


def _tokens(record: CallRecord) -> tuple[int, int, int]:
    return record.prompt_tokens, record.completion_tokens, record.cached_prompt_tokens
