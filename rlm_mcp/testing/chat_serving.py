"""The scripted server's chat completions: what one `POST /v1/chat/completions` does.

`ScriptedLM` (`rlm_mcp.testing.scripted_lm`) owns the sockets, the HTTP and the lifecycle; this
module owns a chat request once it is parsed: its entry in the request log, its place in the
`max_concurrency` queue, the script's latency (delay and decode) and its reply. The counters
(`in_flight`, `serving`, `disconnects`, ...) and the request log live here because only chat
requests move them; `ScriptedLM` inherits them, so they stay its public attributes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm_mcp.testing._http import Response, error_response, wait_or_disconnect
from rlm_mcp.testing.endpoints import Endpoint
from rlm_mcp.testing.prefix import PrefixLedger
from rlm_mcp.testing.script import (
    Replier,
    Script,
    classify,
    count_prompt_tokens,
    count_text_tokens,
    cut_to_tokens,
)
from rlm_mcp.testing.vllm_replies import completion, faulted, unknown_model, window_refusal

# The server's logger since before the split: a test or an operator filtering on it still sees
# "scripted reply failed".
log = logging.getLogger("rlm_mcp.testing.scripted_lm")


@dataclass(frozen=True)
class ChatRequest:
    """One parsed chat request on its way through the queue: what serving it needs."""

    data: dict[str, Any]  # the request JSON
    messages: list[dict[str, Any]]
    role: Any  # "root" / "sub" / what `classify` made of it
    turn: int | None
    reader: asyncio.StreamReader  # to notice a client that goes away during a delay
    buf: bytearray
    record: dict[str, Any]  # its request-log entry, filled in as it is served


class ChatServing:
    """The chat endpoint's state and behaviour; `ScriptedLM` adds the HTTP server around it."""

    def __init__(self, script: Script, *, log_path: Path | None, endpoint: Endpoint | None) -> None:
        self.script = script
        self.endpoint = endpoint  # a personality (rlm_mcp.testing.endpoints); None: vLLM
        self.log_path = log_path
        self.in_flight = self.max_in_flight = self.disconnects = 0
        self.serving = self.max_serving = 0  # chat requests past the `max_concurrency` queue
        self._slots: asyncio.Semaphore | None = None  # `max_concurrency`, made on the server's loop
        self._replier = Replier(self.script)
        self.prefix = PrefixLedger()  # per session: what a prefix cache could reuse (testing/prefix.py)
        self._requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = 0
        self._clock = time.monotonic  # what the script's latency is measured on (tests replace it)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    def requests_by_role(self, role: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["role"] == role]

    def _open_queue(self) -> None:
        """Make the `max_concurrency` queue; on the server's event loop, which it belongs to."""
        limit = self.script.max_concurrency
        # asyncio's semaphore wakes its waiters in arrival order: the queue is FIFO, as vLLM's.
        self._slots = asyncio.Semaphore(limit) if limit else None

    async def _chat(
        self, body: bytes, headers: dict[str, str], reader: asyncio.StreamReader, buf: bytearray
    ) -> Response | None:
        try:
            data = json.loads(body)
        except ValueError:
            return error_response(400, "invalid JSON body")
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return error_response(400, "`messages` must be a list of message objects", "messages")
        role, turn = classify(messages)
        record: dict[str, Any] = {
            "role": role,
            "turn": turn,
            "model": data.get("model"),
            "received": time.time(),
            "body": data,
            "status": None,
            "disconnected": False,
            "headers": dict(headers),  # as received (names in lower case)
            "session": headers.get("x-session-id"),
            "usage": None,  # what the reply reported, when one was sent
            "queued_s": 0.0,  # waited for a `max_concurrency` slot
            "scripted_latency_s": None,  # the script's latency for the reply sent (delay + decode)
        }
        request = ChatRequest(data, messages, role, turn, reader, buf, record)
        with self._lock:
            self._requests.append(record)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        outcome: Response | str = "cancelled"  # stays so if the server stops mid-request
        try:
            if self._slots is None:
                outcome = await self._served(request)
            else:
                queued = time.monotonic()
                async with self._slots:
                    record["queued_s"] = round(time.monotonic() - queued, 6)
                    outcome = await self._served(request)
        finally:
            with self._lock:
                self.in_flight -= 1
                record["status"] = outcome[0] if isinstance(outcome, tuple) else outcome
                if outcome == "disconnected":
                    record["disconnected"] = True
                    self.disconnects += 1
                if self.log_path is not None:
                    with self.log_path.open("a", encoding="utf-8") as fh:
                        fh.write(json.dumps(record) + "\n")
        return outcome if isinstance(outcome, tuple) else None

    async def _served(self, request: ChatRequest) -> Response | str:
        """`_chat_response`, counted as served (past the queue)."""
        with self._lock:
            self.serving += 1
            self.max_serving = max(self.max_serving, self.serving)
        try:
            return await self._chat_response(request)
        finally:
            with self._lock:
                self.serving -= 1

    async def _chat_response(self, request: ChatRequest) -> Response | str:
        """The response, or "disconnected" / "dropped" when none is to be sent."""
        s = self.script
        data, messages, role, turn, record = request.data, request.messages, request.role, request.turn, request.record
        # Served from now (past the queue): the reply goes out when the script's latency, counted
        # from here, has passed. The server's own work on it (reading the prompt, building the
        # reply) happens within that time, not after it: otherwise each served request would
        # hold its slot for its latency plus this process's CPU, and a batch's rounds would take
        # longer than the script says (bench/lm_time.py's ideal is the script's latency).
        served_at = self._clock()
        if (missing := unknown_model(self.script, self.endpoint, data.get("model"))) is not None:
            return missing
        fault = self._replier.take_fault(messages, role, turn)
        delay = s.delay_for(role) + (fault.delay_s if fault else 0.0)
        if delay > 0 and await self._wait_until(served_at + delay, request):
            return "disconnected"
        if fault is not None and (fault_reply := faulted(fault)) is not None:
            return fault_reply
        window = s.max_model_len
        prompt_tokens = counted = count_prompt_tokens(messages)
        field = "max_tokens" if "max_tokens" in data else "max_completion_tokens"
        max_tokens = data.get(field)
        admitted = self.endpoint.admit(data, prompt_tokens, window) if self.endpoint is not None else None
        if isinstance(admitted, tuple):  # the endpoint's refusal
            return admitted
        if admitted is not None:
            prompt_tokens, max_tokens = admitted.prompt_tokens, admitted.max_tokens
        elif (refused := window_refusal(window, prompt_tokens, field, max_tokens)) is not None:
            return refused
        allowed = window - prompt_tokens
        if isinstance(max_tokens, int):
            allowed = min(allowed, max(max_tokens, 0))
        try:
            text = self._replier.reply(messages, role, turn)
        except Exception as exc:  # a broken test callable: say so loudly, like a dead engine
            log.exception("scripted reply failed")
            return error_response(500, f"scripted reply raised {exc!r}")
        finish = "stop"
        if count_text_tokens(text) > allowed:
            text, finish = cut_to_tokens(text, allowed), "length"
        with self._lock:
            self._ids += 1
            ident = self._ids
        response = completion(
            s, data, text, ident=ident, finish=s.finish_reason or finish, prompt_tokens=prompt_tokens, fault=fault
        )
        usage = json.loads(response[1]).get("usage")
        record["usage"] = usage
        decode = s.decode_s(role, count_text_tokens(text))
        record["scripted_latency_s"] = round(delay + decode, 6)
        if decode > 0 and await self._wait_until(served_at + delay + decode, request):
            return "disconnected"
        if role == "root":
            session = record["session"] or ""
            self.prefix.completed(session, self.prefix.request(session, messages, counted), text)
            if s.session_token:
                response = (*response[:2], {**response[2], "x-session-token": s.session_token})
        return response

    async def _wait_until(self, deadline: float, request: ChatRequest) -> bool:
        """Wait until `deadline` (on `_clock`), watching the client: True when it hung up. Past
        the deadline already (the server's own work took that long): no wait."""
        left = deadline - self._clock()
        return left > 0 and await wait_or_disconnect(left, request.reader, request.buf)
