"""Issue 20 item 3: connections that never finish their headers are closed, open connections are
bounded (a flood costs no descriptor), and the fd soft limit is raised at start; an idle
keep-alive connection outlives clients' own idle expiry. Real uvicorn servers on loopback, raw
sockets."""

from __future__ import annotations

import resource
import select
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import uvicorn

from rlm_mcp.config import Settings
from rlm_mcp.server.connections import uvicorn_config
from rlm_mcp.server.http import build_http_app
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT
from tests.fixtures_http import INIT, MCP_HEADERS, server_env

pytestmark = pytest.mark.anyio


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9/v1",
        "data_dir": tmp_path / "data",
        "allowed_roots": [tmp_path],
        "host": "127.0.0.1",
        "port": free_port("127.0.0.1"),
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[None]:
    server = uvicorn.Server(uvicorn_config(settings.server, build_http_app(settings), owners=1, log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await wait_until(lambda: server.started, what="the server start")
        try:
            yield
        finally:
            server.should_exit = True


def _closed(sock: socket.socket) -> bool:
    """True once the server closed `sock` (EOF or reset); never blocks."""
    ready, _, _ = select.select([sock], [], [], 0)
    if not ready:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


async def test_a_connection_that_stops_mid_headers_is_closed(tmp_path: Path) -> None:
    settings = _settings(tmp_path, http_header_timeout_s=1.0)
    async with serving(settings):
        with (
            closing(socket.create_connection(("127.0.0.1", settings.server.port))) as silent,
            closing(socket.create_connection(("127.0.0.1", settings.server.port))) as partial,
        ):
            partial.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            await wait_until(lambda: _closed(silent) and _closed(partial), what="closing slow connections")
        # A whole request is still answered.
        async with httpx.AsyncClient() as client:
            reply = await client.post(f"http://127.0.0.1:{settings.server.port}/mcp", json=INIT, headers=MCP_HEADERS)
        assert reply.status_code == 200


async def test_connections_over_the_bound_are_closed_at_once(tmp_path: Path) -> None:
    settings = _settings(tmp_path, http_max_connections=5, http_header_timeout_s=300.0)
    async with serving(settings):
        socks = [socket.create_connection(("127.0.0.1", settings.server.port)) for _ in range(8)]
        try:
            await wait_until(lambda: sum(_closed(s) for s in socks) >= 3, what="closing the connections over 5")
            assert [_closed(s) for s in socks[:5]] == [False] * 5  # the first five are still held
        finally:
            for s in socks:
                s.close()


async def test_an_idle_keep_alive_connection_is_closed_after_its_setting(tmp_path: Path) -> None:
    settings = _settings(tmp_path, http_keep_alive_s=1)
    async with serving(settings):
        with closing(socket.create_connection(("127.0.0.1", settings.server.port))) as kept:
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            kept.settimeout(60)
            reply = await anyio.to_thread.run_sync(kept.recv, 4096)  # the server shares this loop
            assert reply.startswith(b"HTTP/1.1 200"), reply
            kept.setblocking(False)
            await wait_until(lambda: _closed(kept), what="the idle connection's close")


def test_the_server_keeps_idle_connections_longer_than_clients_do(tmp_path: Path) -> None:
    # A server that closes an idle connection no later than its client may meet the client's next
    # request as it closes: the request gets a reset. The client must always be the one to close.
    settings = _settings(tmp_path)
    config = uvicorn_config(settings.server, build_http_app(settings), owners=1)
    assert config.timeout_keep_alive == settings.server.http_keep_alive_s
    httpx_expiry = httpx2.Limits().keepalive_expiry  # the MCP Python SDK's client: httpx2's pool
    node_fetch_expiry = 4.0  # undici's keepAliveTimeout (the MCP TypeScript SDK's fetch)
    assert httpx_expiry is not None
    assert config.timeout_keep_alive > 2 * max(httpx_expiry, node_fetch_expiry)


def test_the_server_raises_its_fd_soft_limit(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(512, hard)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    argv = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
    # `lower`: the limit the child starts with
    with server_process(argv, port=port, env=server_env(tmp_path), preexec_fn=lower) as proc:
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
        soft = line.split()[3]
        assert soft == str(hard) if hard != resource.RLIM_INFINITY else soft == "unlimited", (line, low)
