"""A raw TCP server on a free loopback port for the LM client's HTTP tests: each test's handler
speaks the bytes it wants to test (a proxy, framing, a dropped connection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def loopback_url(serve: Handler) -> AsyncIterator[str]:
    """`serve` run for each connection; yields the server's base URL (`http://127.0.0.1:PORT`)."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@dataclass
class Connections:
    """What `tracking_url`'s server saw: the client's port for each request answered, in order, and
    the ports of the connections the client closed."""

    served: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)


@asynccontextmanager
async def tracking_url(reply: bytes) -> AsyncIterator[tuple[str, Connections]]:
    """A keep-alive server answering every request (head and Content-Length body) with `reply`;
    yields its base URL and what it saw of the client's connections (which one carried each
    request, which ones the client closed)."""
    seen = Connections()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("peername")[1]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = next((int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                seen.served.append(port)
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            seen.closed.append(port)
        finally:
            writer.close()

    async with loopback_url(serve) as url:
        yield url, seen
