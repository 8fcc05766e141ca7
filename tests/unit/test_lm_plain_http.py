"""The LM client's plain-http path (lm/plain_http.py) against raw HTTP servers on loopback that
answer as servers may: framed by length, by chunks or by the connection's end, compressed, after
a 1xx, closing idle connections, too slow, or not at all."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from rlm_mcp.lm.http import HttpPool, HttpTimeout, HttpTransportError, HttpUnreadable
from rlm_mcp.lm.plain_http import IDLE_REUSE_S, PlainPool
from rlm_mcp.testing.waiting import wait_until
from tests.loopback_tcp import loopback_url, tracking_url

pytestmark = pytest.mark.anyio

Answer = Callable[[int], bytes]  # the bytes to send for the n-th request (from 0) of the server


def ok(body: bytes = b'{"ok": true}', *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        head.encode(),
        len(body),
        body,
    )


@asynccontextmanager
async def raw_server(
    answer: Answer, *, close_after: Callable[[int], bool] = lambda n: False
) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server that reads each request (head and Content-Length body) and writes `answer(n)`;
    yields its base URL and the request heads it read. `close_after(n)`: close the connection
    after the n-th answer. An answer of b"" closes without answering."""
    heads: list[bytes] = []
    connections: list[int] = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                heads.append(head)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                reply = answer(len(heads) - 1)
                if not reply:
                    break
                writer.write(reply)
                await writer.drain()
                if close_after(len(heads) - 1):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async with loopback_url(serve) as url:
        yield url, heads


def pool(**headers: str) -> HttpPool:
    return HttpPool(headers=dict(headers), timeout_s=5, connect_s=5, trust_env=False)


async def test_replies_framed_every_way_are_read_whole_and_the_connection_reused() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    informational = b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after 100")
    packed = gzip.compress(b"zipped")
    answers = [
        ok(b"plain"),
        chunked,
        informational,
        ok(packed, "Content-Encoding: gzip"),
        ok(zlib.compress(b"z"), "Content-Encoding: deflate"),
    ]
    async with raw_server(lambda n: answers[n]) as (url, heads):
        client = pool(Authorization="Bearer key")
        try:
            replies = [await client.request("POST", f"{url}/v1/chat/completions", json_body=b"{}") for _ in answers]
        finally:
            await client.aclose()
    assert [r.content for r in replies] == [b"plain", b"hello world", b"after 100", b"zipped", b"z"]
    assert replies[0].status_code == 200 and replies[0].headers["content-type"] == "application/json"
    first = heads[0].decode()
    assert first.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert "Authorization: Bearer key\r\n" in first and "Content-Type: application/json\r\n" in first
    assert "Content-Length: 2\r\n" in first and f"Host: {url.removeprefix('http://')}\r\n" in first


async def test_a_body_ended_by_the_connection_and_a_server_that_closes_each_connection() -> None:
    until_eof = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end"
    async with raw_server(lambda n: until_eof, close_after=lambda n: True) as (url, heads):
        client = pool()
        try:
            replies = [await client.request("GET", f"{url}/v1/models") for _ in range(3)]
        finally:
            await client.aclose()
    assert [r.content for r in replies] == [b"to the end"] * 3
    assert heads[0].startswith(b"GET /v1/models HTTP/1.1\r\n") and b"Content-Length" not in heads[0]


async def test_a_request_header_replaces_the_pools_whatever_its_case() -> None:
    async with raw_server(lambda n: ok()) as (url, heads):
        client = pool(Authorization="Bearer key")
        try:
            await client.request(
                "POST", f"{url}/finish_session?session_id=a", headers={"authorization": "Bearer router"}
            )
        finally:
            await client.aclose()
    text = heads[0].decode().lower()
    assert text.count("authorization:") == 1 and "authorization: bearer router" in text
    assert text.startswith("post /finish_session?session_id=a http/1.1")


async def test_failures_are_the_pools_three_kinds_and_a_failed_connection_is_not_reused() -> None:
    answers: dict[int, bytes] = {
        0: b"",  # closed without answering
        1: b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\ncut short",  # then closed mid-body
        2: b"NOT HTTP AT ALL\r\n\r\n",
        3: ok(b"fine"),
    }

    def answer(n: int) -> bytes:
        return answers[n]

    async with raw_server(answer, close_after=lambda n: n == 1) as (url, heads):
        client = pool()
        try:
            with pytest.raises(HttpTransportError, match="Server disconnected"):
                await client.request("POST", url + "/v1/chat/completions", json_body=b"{}")
            with pytest.raises(HttpUnreadable, match="not completed"):
                await client.request("POST", url + "/v1/chat/completions", json_body=b"{}")
            with pytest.raises(HttpUnreadable):
                await client.request("POST", url + "/v1/chat/completions", json_body=b"{}")
            assert (await client.request("POST", url + "/v1/chat/completions", json_body=b"{}")).content == b"fine"
        finally:
            await client.aclose()
    assert len(heads) == 4


async def test_the_timeout_bounds_the_wait_and_nothing_listening_is_a_transport_error() -> None:
    held: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)  # accepts, never answers
    port = silent.sockets[0].getsockname()[1]
    client = pool()
    try:
        with pytest.raises(HttpTimeout):
            await client.request("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json_body=b"{}", timeout_s=0.2)
    finally:
        await client.aclose()
        for writer in held:
            writer.close()
        silent.close()
        await silent.wait_closed()
    async with raw_server(lambda n: ok()) as (url, _):
        pass  # a port that listened and no longer does
    client = pool()
    try:
        with pytest.raises(HttpTransportError, match="Cannot connect to host"):
            await client.request("GET", url + "/v1/models")
    finally:
        await client.aclose()


async def test_a_header_that_is_not_one_line_never_reaches_the_wire() -> None:
    async with raw_server(lambda n: ok()) as (url, heads):
        client = pool()
        try:
            with pytest.raises(ValueError):  # refused by aiohttp, which such a request goes to
                await client.request(
                    "POST", url + "/v1/chat/completions", json_body=b"{}", headers={"X-A": "b\r\nX-B: c"}
                )
        finally:
            await client.aclose()
    assert heads == []


async def test_a_get_the_server_drops_on_a_reused_connection_is_sent_again_and_a_post_is_not() -> None:
    answers = {0: ok(b"first"), 1: b"", 2: ok(b"again"), 3: ok(b"warm"), 4: b""}
    async with raw_server(lambda n: answers[n]) as (url, heads):
        client = pool()
        try:
            assert (await client.request("GET", url + "/v1/models")).content == b"first"
            assert (await client.request("GET", url + "/v1/models")).content == b"again"  # dropped, then resent
            assert (await client.request("POST", url + "/v1/chat/completions", json_body=b"{}")).content == b"warm"
            with pytest.raises(HttpTransportError, match="Server disconnected"):
                await client.request("POST", url + "/v1/chat/completions", json_body=b"{}")
        finally:
            await client.aclose()
    assert len(heads) == 5


async def test_a_connection_idle_past_the_reuse_limit_is_closed_not_reused() -> None:
    # Servers close idle connections themselves (vLLM after 5 s): a request sent on one as the
    # server closes it would meet a reset, so the pool closes first.
    now = [0.0]
    async with tracking_url(ok()) as (url, seen):
        client = PlainPool({}, timeout_s=5, connect_s=5, clock=lambda: now[0])
        try:

            async def post() -> None:
                reply = await client.request(
                    "POST", url + "/v1/chat/completions", body=b"{}", headers=None, timeout_s=None
                )
                assert reply.status_code == 200

            await post()
            now[0] += IDLE_REUSE_S - 0.5
            await post()  # idle below the limit: the same connection
            now[0] += IDLE_REUSE_S
            await post()  # idle past it: a new one, the old one closed
            await wait_until(lambda: seen.closed == seen.served[:1], what="the stale connection's close")
        finally:
            client.close()
    assert seen.served[0] == seen.served[1] != seen.served[2], seen
