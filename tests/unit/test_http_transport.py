"""Streamable HTTP: bearer-token auth on every request, refusal to bind off loopback without a
token. The server is the real console script in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rlm_mcp.testing.servers import free_port, server_process
from tests.fixtures_e2e import SERVER_SCRIPT
from tests.fixtures_http import TOKEN, server_env


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # One server for the module's two tests (a server start is most of their time): one checks
    # refusals, the other loads a context; neither depends on the other's state.
    tmp_path = tmp_path_factory.mktemp("http-server")
    port = free_port()
    env = server_env(tmp_path, RLM_MCP_AUTH_TOKEN=TOKEN)
    with server_process([str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)], port=port, env=env):
        yield f"http://127.0.0.1:{port}/mcp"


def test_requests_without_the_token_are_refused(http_server: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"accept": "application/json, text/event-stream"}
    response = httpx.post(http_server, json=body, headers=headers)
    assert response.status_code == 401
    assert "Bearer" in response.headers["www-authenticate"]
    wrong = httpx.post(http_server, json=body, headers={**headers, "authorization": "Bearer nope"})
    assert wrong.status_code == 401


@pytest.mark.anyio
async def test_an_authenticated_client_lists_tools_and_loads_a_context(http_server: str) -> None:
    http_client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"})
    async with http_client, Client(streamable_http_client(http_server, http_client=http_client)) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "rlm_complete" in names and "rlm_start" in names
        loaded = await client.call_tool("rlm_load_context", {"text": "over http"})
        assert not loaded.is_error
        assert loaded.structured_content["bytes"] == 9


def test_binding_off_loopback_without_a_token_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(SERVER_SCRIPT), "serve", "--transport", "http", "--host", "0.0.0.0", "--port", str(free_port())],
        env=server_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "RLM_MCP_AUTH_TOKEN" in proc.stderr
    assert proc.stdout == ""


def test_a_worker_off_loopback_without_a_token_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # Its /metrics would tell anyone who reaches it about every owner's runs; the refusal comes
    # before the database is asked (nothing listens on this one).
    argv = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--role", "worker", "--host", "0.0.0.0"]
    env = server_env(tmp_path, RLM_MCP_DATABASE_URL="postgresql://rlm:pw@127.0.0.1:9/rlm")
    proc = subprocess.run([*argv, "--port", str(free_port())], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "/metrics on 0.0.0.0 without a token" in proc.stderr and "--host 127.0.0.1" in proc.stderr, proc.stderr
    assert "RLM_MCP_AUTH_TOKENS" in proc.stderr and "unreachable" not in proc.stderr


def test_the_start_line_names_what_the_server_answers(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    env = server_env(tmp_path, RLM_MCP_LOG_LEVEL="INFO")
    with server_process(
        [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)], port=port, env=env, log=log
    ):
        pass
    text = log.read_text()
    assert f"serving MCP (streamable HTTP) on http://127.0.0.1:{port}/mcp, the viewer on" in text, text
    assert "only its health check" not in text and "serving only" not in text


def test_stdio_mode_prints_nothing_but_protocol(tmp_path: Path) -> None:
    # stdin closed at once: the server must exit cleanly without writing to stdout.
    proc = subprocess.run([str(SERVER_SCRIPT)], env=server_env(tmp_path), input=b"", capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
