"""A webhook receiver for the tests: a real HTTP server on loopback (uvicorn) that records every
request (headers, raw body) and answers the statuses it is given, then 200."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import uvicorn
from starlette.types import Receive, Scope, Send

from rlm_mcp.testing.servers import free_port


@dataclass
class Receiver:
    answers: list[int] = field(default_factory=list)  # status per request, then 200
    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((headers, body))
        status = self.answers.pop(0) if self.answers else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@asynccontextmanager
async def receiving(receiver: Receiver) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(receiver, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        while not server.started:
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}/hooks"
        finally:
            server.should_exit = True


__all__ = ["Receiver", "receiving"]
