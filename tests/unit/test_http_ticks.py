"""The HTTP server's main loop sleeps between its once-a-second ticks, yet stops as soon as it is asked to
and its responses still carry a `date` header. A real uvicorn server on loopback."""

from __future__ import annotations

import email.utils
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from rlm_mcp.server import ticks
from rlm_mcp.server.ticks import TickingServer
from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.waiting import wait_until

pytestmark = pytest.mark.anyio


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _server() -> tuple[TickingServer, int]:
    port = free_port("127.0.0.1")
    config = uvicorn.Config(_ok, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    return TickingServer(config), port


async def test_a_stop_request_wakes_the_loop_between_its_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tick an hour long: the server stops only because setting `should_exit` wakes its loop.
    monkeypatch.setattr(ticks, "TICK_S", 3600.0)
    server, _ = _server()
    stopped = anyio.Event()

    async def serve() -> None:
        await server.serve()
        stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        await wait_until(lambda: server.started, what="the server start")
        server.should_exit = True
        with anyio.fail_after(60):  # a hang guard: without the wake-up it would wait an hour
            await stopped.wait()
    assert server.should_exit


async def test_responses_carry_the_date_header() -> None:
    server, port = _server()
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await wait_until(lambda: server.started, what="the server start")
        try:
            async with httpx.AsyncClient() as client:
                response = await client.get(f"http://127.0.0.1:{port}/")
        finally:
            server.should_exit = True
    assert response.status_code == 200
    assert email.utils.parsedate_to_datetime(response.headers["date"]).tzinfo is not None


async def test_a_stop_asked_before_the_loop_starts_is_kept() -> None:
    server, _ = _server()
    server.should_exit = True  # before serve: the loop is not known yet, nothing to wake
    with anyio.fail_after(60):  # the check: serve returns instead of waiting for a stop
        await server.serve()
