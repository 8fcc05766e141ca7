"""Keep-alive HTTP/1.1 to a plain-http endpoint the environment is not read for (a loopback vLLM),
framed by httptools (llhttp, the parser uvicorn uses): the LM client's hot path.

Why not aiohttp here: per request its client builds a request object, a response object, a
timeout handle, a cookie filter and, on Python 3.11, a task to write the body (a loop round of
its own). On the 2-core VM: 0.31 ms of the event loop's CPU and 3.6 loop rounds per bare
request against 0.15 ms and 2 (`bench/lm_env.py`, both side by side); in a further root turn the
LM call's HTTP request 0.59-0.65 ms against 0.21-0.24 ms, 0.8 fewer loop rounds per turn
(bench/turn_cpu.py --phases, alternating trees). Everything else (https, a proxy, a `.netrc` login, other
methods) stays on aiohttp (lm/http.py).

What it does, as aiohttp did for these requests: one request at a time per connection, idle
connections kept without limit and reused newest first, one closed by the server skipped, one
idle for `IDLE_REUSE_S` or more closed instead (below); a
body framed by Content-Length, chunks or the connection's end; a 1xx answer skipped; gzip and
deflate bodies decoded; the whole request bounded by its timeout, the connect by its own. The
failures are the pool's three kinds with aiohttp's wording.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from rlm_mcp.lm.http_reply import HttpReply, HttpTimeout, HttpTransportError, HttpUnreadable

_Answer = tuple[int, CIMultiDictProxy[str], bytes]

# A connection idle this long is not reused. Servers close idle connections after a while of their
# own (vLLM's uvicorn after 5 s): a request sent on one just as the server closes it meets a reset,
# and a POST is not sent twice, so the call failed as "unreachable" and waited out a retry's
# back-off. Below 5 s the client closes first (as Node's fetch does, at 4 s); a new loopback or
# LAN connection costs a fraction of a millisecond. An `http://` endpoint off loopback, sent by
# aiohttp, has the same limit (`lm/endpoint.py`).
IDLE_REUSE_S = 4.0


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `waiter` is the answer of the request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[_Answer] | None = None
        self.closed = False
        self.reusable = False  # the last answer was whole and the server keeps the connection open
        self.idle_since = 0.0  # the pool's clock when the connection went back to it
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._body: list[bytes] = []
        self._status = 0
        self._headers_done = False
        self._until_eof = False  # no length and no chunks: the body ends with the connection

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():  # nothing asked: a server out of step
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpUnreadable(f"ClientResponseError: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headers_done and self._until_eof:  # the connection's end was the body's
            self._answer()
        elif self._headers_done:
            self._fail(HttpUnreadable("ClientPayloadError: Response payload is not completed"))
        else:
            self._fail(HttpTransportError("Server disconnected"))

    # --- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._headers = CIMultiDict()
        self._body = []
        self._headers_done = self._until_eof = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.add(name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        self._status = self.parser.get_status_code()
        if 100 <= self._status < 200:  # informational: the answer follows
            return
        self._headers_done = True
        framed = "Content-Length" in self._headers or "Transfer-Encoding" in self._headers
        self._until_eof = not framed and self._status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if not self._headers_done:  # the end of a 1xx
            return
        self.reusable = self.parser.should_keep_alive()
        self._answer()

    # --- the request's side -------------------------------------------------------------
    def _answer(self) -> None:
        self._headers_done = False
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        try:
            content = _decoded(b"".join(self._body), self._headers.get("Content-Encoding"))
        except HttpUnreadable as exc:
            waiter.set_exception(exc)
            return
        waiter.set_result((self._status, CIMultiDictProxy(self._headers), content))

    def _fail(self, error: Exception) -> None:
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    def close(self) -> None:
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


def _decoded(content: bytes, coding: str | None) -> bytes:
    if coding is None or coding.lower() == "identity" or not content:
        return content
    try:
        if coding.lower() in ("gzip", "x-gzip"):
            return zlib.decompress(content, 16 + zlib.MAX_WBITS)
        if coding.lower() == "deflate":  # zlib-wrapped as the standard says, raw as some servers send
            try:
                return zlib.decompress(content)
            except zlib.error:
                return zlib.decompress(content, -zlib.MAX_WBITS)
    except zlib.error as exc:
        raise HttpUnreadable(f"ClientPayloadError: Can not decode content-encoding: {coding}: {exc}") from exc
    raise HttpUnreadable(f"ClientPayloadError: Can not decode content-encoding: {coding}")


def plain_target(url: str) -> tuple[str, int, str, str] | None:
    """(host, port, request target, Host header) of a plain-http URL; None for any other."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.username is not None:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, target, parts.netloc


def _safe(text: str) -> bool:
    return "\r" not in text and "\n" not in text


class PlainPool:
    """Connections to plain-http origins for one endpoint's pool. Use it on one event loop."""

    def __init__(
        self,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        connect_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # What aiohttp sent besides the caller's: it decodes gzip and deflate, as `_decoded` does.
        self._headers = {"Accept": "*/*", "Accept-Encoding": "gzip, deflate", "User-Agent": "rlm-mcp", **headers}
        self._timeout_s = timeout_s
        self._connect_s = connect_s
        self._clock = clock  # how long a connection has been idle (`IDLE_REUSE_S`)
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._targets: dict[str, tuple[str, int, str, str] | None] = {}
        # A header that is not one line would split the request: such a pool sends nothing (aiohttp refuses it).
        self._closed = not all(_safe(k) and _safe(v) for k, v in self._headers.items())

    def takes(self, method: str, url: str, headers: Mapping[str, str] | None) -> bool:
        """Whether this pool sends the request (a GET or POST to a plain-http URL, headers one
        line each); aiohttp sends the others."""
        if method not in ("GET", "POST") or self._closed:
            return False
        target = self._targets.get(url)
        if target is None:
            if url in self._targets:
                return False
            target = plain_target(url)
            if "?" not in url:  # the fixed URLs (a router's finish_session carries a session id)
                self._targets[url] = target
            if target is None:
                return False
        return headers is None or all(_safe(k) and _safe(v) for k, v in headers.items())

    async def request(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str] | None, timeout_s: float | None
    ) -> HttpReply:
        target = self._targets.get(url) or plain_target(url)
        assert target is not None, url
        host, port, path, host_header = target
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._timeout_s if timeout_s is None else timeout_s)
        merged = {name.lower(): (name, value) for name, value in self._headers.items()}
        if method == "POST" and "content-type" not in merged:  # aiohttp's default for a POST
            merged["content-type"] = ("Content-Type", "application/octet-stream")
        for name, value in (headers or {}).items():
            merged[name.lower()] = (name, value)
        head = [f"{method} {path} HTTP/1.1\r\nHost: {host_header}\r\n"]
        head.extend(f"{name}: {value}\r\n" for name, value in merged.values() if name.lower() != "host")
        if body is not None or method == "POST":
            head.append(f"Content-Length: {len(body or b'')}\r\n")
        head.append("\r\n")
        request = "".join(head).encode("utf-8") + (body or b"")  # header values as aiohttp writes them

        # A GET on a reused connection the server closed as it was sent is sent once more on a
        # new one, as aiohttp retries an idempotent request; a POST's failure is the caller's.
        retry = method == "GET"
        while True:
            conn, reused = await self._connection(host, port, loop, deadline)
            try:
                return HttpReply(url, *await self._exchange(conn, request, loop, deadline, (host, port)))
            except HttpTransportError:
                if not (retry and reused):
                    raise
                retry = False

    async def _exchange(
        self, conn: _Connection, request: bytes, loop: asyncio.AbstractEventLoop, deadline: float, key: tuple[str, int]
    ) -> _Answer:
        waiter: asyncio.Future[_Answer] = loop.create_future()
        conn.waiter = waiter
        conn.reusable = False
        timer = loop.call_at(deadline, _time_out, waiter)
        try:
            assert conn.transport is not None
            conn.transport.write(request)
            return await waiter
        finally:
            timer.cancel()
            conn.waiter = None
            if conn.reusable and not conn.closed and not self._closed:
                conn.idle_since = self._clock()
                self._idle.setdefault(key, []).append(conn)
            else:
                conn.close()

    async def _connection(
        self, host: str, port: int, loop: asyncio.AbstractEventLoop, deadline: float
    ) -> tuple[_Connection, bool]:
        """An open connection to (host, port) and whether it served a request before."""
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if self._clock() - conn.idle_since < IDLE_REUSE_S:
                return conn, True
            # Idle too long: so are all the others (they went back to the pool before it).
            for stale in (conn, *idle):
                stale.close()
            idle.clear()
        try:
            async with asyncio.timeout_at(min(deadline, loop.time() + self._connect_s)):
                _, conn = await loop.create_connection(_Connection, host, port)
        except TimeoutError as exc:
            raise HttpTimeout(f"Connection timeout to host http://{host}:{port}") from exc
        except OSError as exc:
            raise HttpTransportError(
                f"Cannot connect to host {host}:{port} ssl:default [{exc.strerror or exc}]"
            ) from exc
        return conn, False

    def close(self) -> None:
        """Close the idle connections; those in flight close when their request ends."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def _time_out(waiter: asyncio.Future[_Answer]) -> None:
    if not waiter.done():
        waiter.set_exception(HttpTimeout("TimeoutError"))
