"""A raw TCP server on a free loopback port for the LM client's HTTP tests: each test's handler
speaks the bytes it wants to test (a proxy, framing, a dropped connection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

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
