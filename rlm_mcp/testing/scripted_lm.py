"""A scripted OpenAI-compatible server (vLLM-shaped) on loopback: the project's stand-in LM.

In process (a background thread runs the server, so sync and async tests can both use it)::

    async with ScriptedLM(Script(root=["```repl\\nprint(1)\\n```", "..."])) as lm:
        settings = Settings(base_url=lm.base_url)      # http://127.0.0.1:PORT/v1
        ...
        lm.requests          # chat requests seen (list of dicts, see "Request log")
        lm.max_in_flight     # most chat requests in flight at once
    with ScriptedLM({"sub_default": "yes"}) as lm: ...   # a dict is validated as a Script
    with ScriptedLM(script, endpoint=Ollama()) as lm: ...  # another server's personality
                         # (rlm_mcp.testing.endpoints: listing, window, auth, parameters, overflow)

As a subprocess::

    python -m rlm_mcp.testing.scripted_lm --script script.json [--port 0]
           [--port-file F] [--log requests.jsonl] [--host 127.0.0.1]

prints its base URL (``http://127.0.0.1:PORT/v1``) as the one line on stdout and, with
``--port-file``, writes the same URL to F (atomically, so a poller never reads half of it).
It stops on SIGTERM/SIGINT.

The script (a JSON object, or `rlm_mcp.testing.script.Script` in Python) says what it replies,
which faults it injects and how it behaves: its format is documented in
`rlm_mcp.testing.script`.

Routing and token counts are the script's (`rlm_mcp.testing.script`); the window's rules and
every reply's shape are vLLM's (`rlm_mcp.testing.vllm_replies`).

Request log: each chat request appends ``{"role", "turn", "model", "received" (epoch s),
"body" (the request JSON), "status", "disconnected", "headers" (as received, lower-case
names), "session" (its X-Session-ID), "usage" (as replied)}`` to `requests` and, with a log path,
one JSON line to that file. `hits` counts requests per path (all endpoints), `connections`
the TCP connections accepted, `max_in_flight` the most concurrent chat requests. A client that
disconnects while its reply is delayed is counted in `disconnects` (vLLM aborts those).

Prefix reuse: `prefix` (rlm_mcp.testing.prefix.PrefixLedger) records, per session
(X-Session-ID), how many tokens of each root request a prefix cache could reuse from the
session's previous request and its completion. With `session_token` set, root replies carry an
`x-session-token` header (as llm-d's session-affinity scorer sends); with `server_header`, every
reply carries `x-served-by` (which backend answered, behind a router).

Latency: `delay_s` (per call), `tokens_per_s` (decode time per completion token) and
`max_concurrency` (requests served at once, the rest queued in arrival order) make it behave
like a loaded model server; `serving`/`max_serving` count the requests past that queue, and each
request's log entry has its `queued_s` and its `scripted_latency_s` (delay + decode).

Health: GET /health answers 200 (what vllm-router and the production-stack router poll).

The HTTP is HTTP/1.1 with keep-alive; each response goes out in one write with TCP_NODELAY,
so reused connections never stall on delayed ACKs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import threading
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

from rlm_mcp.testing._http import Response, encode_response, json_response, read_request
from rlm_mcp.testing.chat_serving import ChatServing
from rlm_mcp.testing.endpoints import Endpoint
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.vllm_replies import model_cards, tokenize


class ScriptedLM(ChatServing):
    """The server. `start()`/`stop()` or a (sync or async) context manager.

    The chat endpoint (request log, queue, latency, reply) is `ChatServing`'s
    (`rlm_mcp.testing.chat_serving`); this class is the HTTP server around it."""

    def __init__(
        self,
        script: Script | dict[str, Any] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | Path | None = None,
        endpoint: Endpoint | None = None,
    ) -> None:
        super().__init__(
            script if isinstance(script, Script) else Script.model_validate(script or {}),
            log_path=Path(log_path) if log_path else None,
            endpoint=endpoint,
        )
        self.host, self.port = host, port
        self.hits: Counter[str] = Counter()
        self.connections = 0
        self.alive = True  # False once stop()ped: the process "was killed"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._conns: set[asyncio.Task[None]] = set()

    # --- public surface ---------------------------------------------------------------------
    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}{self.endpoint.api_prefix if self.endpoint else '/v1'}"

    def reset_log(self) -> None:
        with self._lock:
            self._requests.clear()
            self.hits.clear()
            self.max_in_flight = self.in_flight
            self.max_serving = self.serving
            self.disconnects = 0

    def start(self) -> ScriptedLM:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self.serve(ready.set))
            except BaseException as exc:  # surfaced by start(), else lost in the thread
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="scripted-lm", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise RuntimeError(f"scripted LM failed to start: {failure[0]!r}") from failure[0]
        return self

    def add_capacity(self, more: int) -> None:
        """Serve `more` chat requests more at once from now on (an endpoint that scales out;
        queued requests start at once). Only with `max_concurrency` set."""
        loop, slots = self._loop, self._slots
        if loop is None or slots is None:
            raise RuntimeError("add_capacity needs a started server with max_concurrency")

        def grow() -> None:
            for _ in range(more):
                slots.release()  # asyncio's Semaphore is unbounded: each release is one more place

        loop.call_soon_threadsafe(grow)

    def stop(self) -> None:
        self.alive = False
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> ScriptedLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ScriptedLM:
        return self.start()  # binding a loopback socket takes well under a millisecond

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def serve(self, on_ready: Any = None) -> None:
        """Serve until `stop()` (or, in the CLI, a signal). Runs on the current event loop."""
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._open_queue()
        server = await asyncio.start_server(self._connection, self.host, self.port, backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await server.wait_closed()

    # --- HTTP -------------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        with self._lock:
            self.connections += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        try:
            while True:
                request = await read_request(reader, buf)
                if request is None:
                    break
                method, path, headers, body = request
                response = await self._dispatch(method, path, headers, body, reader, buf)
                if response is not None and self.script.server_header:
                    response = (*response[:2], {**response[2], "x-served-by": self.script.server_header})
                if response is None:  # a dropped fault, or the client went away
                    break
                writer.write(encode_response(*response))  # one write per response
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.CancelledError, ValueError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _dispatch(
        self, method: str, path: str, headers: dict[str, str], body: bytes, reader: asyncio.StreamReader, buf: bytearray
    ) -> Response | None:
        with self._lock:
            self.hits[path] += 1
        s = self.script
        if self.endpoint is not None:
            path, answered = self.endpoint.route(method, path, headers, s)
            if answered is not None:
                return answered
        if path == "/v1/chat/completions" and method == "POST":
            return await self._chat(body, headers, reader, buf)
        if path == "/v1/models" and method == "GET" and s.models_endpoint:
            cards = self.endpoint.model_cards(s) if self.endpoint is not None else None
            return json_response(200, {"object": "list", "data": model_cards(s) if cards is None else cards})
        if path == "/tokenize" and method == "POST" and s.tokenize:
            return tokenize(self.script, self.endpoint, body)
        if path == "/health" and method == "GET" and s.health:
            return 200, b"", {}
        return json_response(404, {"detail": "Not Found"})


# `--demo`: the root LM's one reply measures the context in the sandbox and answers with that, so
# a newcomer sees a whole run (sandbox, progress, answer) with no model at all.
DEMO_REPLY = (
    "```repl\n"
    "text = context if isinstance(context, str) else str(context)\n"
    "print(len(text), text.count(chr(10)))\n"
    'answer["content"] = f"(scripted demo LM) the context has {len(text):,} characters '
    'and {text.count(chr(10)):,} lines"\n'
    'answer["ready"] = True\n'
    "```"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlm_mcp.testing.scripted_lm", description=__doc__.split("\n")[0])
    parser.add_argument("--script", help="script JSON file (default: an empty script)")
    parser.add_argument("--demo", action="store_true", help="a script for trying rlm-mcp without a GPU (DEMO_SCRIPT)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the base URL here once listening")
    parser.add_argument("--log", help="append each chat request as a JSON line here")
    parser.add_argument("--delay-s", type=float, help="per-call latency in seconds (the script's delay_s)")
    parser.add_argument("--tokens-per-s", type=float, help="decode rate (the script's tokens_per_s)")
    parser.add_argument("--max-concurrency", type=int, help="requests served at once; the rest queue")
    args = parser.parse_args(argv)
    script = Script.load(args.script) if args.script else Script(root=[DEMO_REPLY]) if args.demo else Script()
    overrides = {
        key: value
        for key, value in (
            ("delay_s", args.delay_s),
            ("tokens_per_s", args.tokens_per_s),
            ("max_concurrency", args.max_concurrency),
        )
        if value is not None
    }
    if overrides:  # validated as the script's own keys are
        script = Script.model_validate({**script.model_dump(), **overrides})
    server = ScriptedLM(script, host=args.host, port=args.port, log_path=args.log)

    def announce() -> None:
        # Signal handlers and the port file first: whoever reads the URL may act on it at once.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        if args.port_file:
            tmp = f"{args.port_file}.tmp{os.getpid()}"
            Path(tmp).write_text(server.base_url + "\n", encoding="utf-8")
            os.replace(tmp, args.port_file)
        print(server.base_url, flush=True)  # the CLI's one stdout line: its URL

    try:
        asyncio.run(server.serve(announce))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
