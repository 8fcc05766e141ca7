"""Helpers for tests of the HTTP transport: raw MCP requests, an in-process uvicorn server on a
loopback address, the environment of the console script served over HTTP, and an MCP client that
speaks as one bearer token."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.extension import ClientExtension
from mcp.client.streamable_http import streamable_http_client

from rlm_mcp.config import Settings
from rlm_mcp.server.http import build_http_app
from rlm_mcp.testing.servers import free_port
from tests.fixtures_e2e import coverage_env, docker_host_env
from tests.fixtures_surface import make_settings

# The first request of an MCP session, as raw JSON-RPC, and the headers streamable HTTP requires.
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

# The bearer token of a console-script server started with `server_env(..., RLM_MCP_AUTH_TOKEN=TOKEN)`.
TOKEN = "s3cret-token-for-tests"


def http_settings(tmp_path: Path, host: str, **overrides: Any) -> Settings:
    """Settings of a server bound to `host` on a free port (no LM behind it)."""
    return make_settings(tmp_path, "http://127.0.0.1:9/v1", host=host, port=free_port(host), **overrides)


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[str]:
    """The HTTP app of `settings` served by uvicorn in this event loop; yields its /mcp URL."""
    server = uvicorn.Server(
        uvicorn.Config(
            build_http_app(settings), host=settings.server.host, port=settings.server.port, log_level="warning"
        )
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(30):
            while not server.started:
                await anyio.sleep(0.05)
        shown = f"[{settings.server.host}]" if ":" in settings.server.host else settings.server.host
        try:
            yield f"http://{shown}:{settings.server.port}/mcp"
        finally:
            server.should_exit = True


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of `rlm-mcp serve` in a subprocess: data and allowed root under `tmp_path`."""
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", ""),
        "RLM_MCP_DATA_DIR": str(tmp_path / "data"),
        "RLM_MCP_ALLOWED_ROOTS": str(tmp_path),
        "RLM_MCP_LOG_LEVEL": "WARNING",
        **coverage_env(),
        **docker_host_env(),
    }
    env.update(extra)
    return env


@asynccontextmanager
async def as_token(
    url: str, token: str, *, extensions: Sequence[ClientExtension] | None = None
) -> AsyncIterator[Client]:
    """An MCP client of `url` over streamable HTTP, sending `token` as its bearer token (and
    declaring `extensions` on each request)."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with http, Client(streamable_http_client(url, http_client=http), extensions=extensions) as client:
        yield client


async def resource_error(client: Client, uri: str) -> str:
    """The error a resource read must raise, as text."""
    with pytest.raises(Exception) as err:  # the SDK raises its own error type
        await client.read_resource(uri)
    return str(err.value)
