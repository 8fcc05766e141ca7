"""What a new user meets on the first steps, each as they meet it: the fix printed when team
mode's driver is missing, header rows in the listings, `runs export | head`, log lines beside the
live progress line, `runs view --url` behind a private CA, an oversized MCP request, and what a
worker says it serves. (The quickstart itself: tests/e2e/test_demo.py.)"""

from __future__ import annotations

import io
import logging
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import httpx
import pytest
from rich.file_proxy import FileProxy

from rlm_mcp.assembly import make_stores
from rlm_mcp.cli import main
from rlm_mcp.cli.run import ProgressDisplay
from rlm_mcp.errors import TEAM_EXTRA_FIX, AccessDeniedError, BadArgumentError, RlmMcpError
from rlm_mcp.server.health import Readiness, health_app
from rlm_mcp.server.http import build_http_app, serve_http
from rlm_mcp.server.listen import bind_listener
from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until
from rlm_mcp.viewer.local import view
from tests.fixtures_haproxy import make_certificate
from tests.fixtures_uv import REPO, user_env, uv_path

NOWHERE_DB = "postgresql://rlm:pw@127.0.0.1:9/rlm"  # nothing listens on port 9


@pytest.fixture
def data_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLM_MCP_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def test_without_the_team_extra_doctor_prints_a_fix_that_works_from_a_checkout(tmp_path: Path) -> None:
    # A checkout's environment as `uv run` makes it (no extras), then the fix as printed.
    env = user_env(tmp_path / "venv", RLM_MCP_DATABASE_URL=NOWHERE_DB, RLM_MCP_DATA_DIR=str(tmp_path / "data"))

    def doctor(*uv_args: str) -> str:
        proc = subprocess.run(
            [uv_path(), "run", *uv_args, "rlm-mcp", "doctor"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        return proc.stdout + proc.stderr

    without = doctor()
    assert "the PostgreSQL driver (the team extra) is not installed" in without, without
    assert "uv run --extra team rlm-mcp" in without and "pip install 'rlm-mcp[team]'" in without, without
    with_extra = doctor("--extra", "team")  # the command the fix names
    assert "not installed" not in with_extra and "database" in with_extra, with_extra


def test_serve_without_the_driver_names_the_same_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlm_mcp.assembly import make_stores

    monkeypatch.setitem(sys.modules, "rlm_mcp.store.pg", None)  # as if psycopg were not installed
    with pytest.raises(RlmMcpError) as raised:
        make_stores(make_settings(tmp_path, database_url=NOWHERE_DB))
    assert TEAM_EXTRA_FIX in str(raised.value) and "uv run --extra team" in TEAM_EXTRA_FIX


def test_listings_start_with_a_header_row(data_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contexts", "list"]) == 0
    assert capsys.readouterr().out.split() == ["CONTEXT", "ID", "BYTES", "FORMAT", "NAME"]
    assert main(["runs", "list"]) == 0
    assert capsys.readouterr().out.split() == ["RUN", "ID", "STARTED", "DURATION", "COST", "STATUS", "QUERY"]


class ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone (`| head` after its lines)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_reader_that_goes_away_ends_the_command_quietly(
    data_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["contexts", "list"]) == 141  # SIGPIPE's status, as `cat` gives; no traceback
    assert "Traceback" not in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_go_above_the_live_progress_line() -> None:
    terminal = Terminal()
    handler = logging.StreamHandler(terminal)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with ProgressDisplay(terminal):
            assert isinstance(handler.stream, FileProxy), "a log line would be drawn inside the status line"
            logging.getLogger("rlm_mcp.test").warning("a log line")
        assert handler.stream is terminal
    finally:
        root.removeHandler(handler)
    assert "a log line" in terminal.getvalue()


class Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(401)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on loopback with a self-signed certificate; it answers 401 to anything."""
    _, cert = make_certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, tmp_path / "key.pem")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    server.handle_error = lambda *args: None  # type: ignore[method-assign]  # the refused handshake
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)


@pytest.mark.anyio
async def test_runs_view_url_behind_a_private_ca_names_the_ca_fix(
    tls_server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = tls_server
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    settings = make_settings(tmp_path, auth_token="t")
    with pytest.raises(BadArgumentError) as raised:
        await view(
            make_stores(settings),
            None,
            url=url,
            output=None,
            open_browser=False,
            max_records=settings.runs.run_max_records,
            auth_token=settings.server.auth_token,
        )
    said = str(raised.value)
    assert "certificate is not trusted" in said and "SSL_CERT_FILE=" in said and "rlm-mcp serve" not in said, said
    # The fix as printed: with the CA named, TLS succeeds and the server's own answer comes through.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with pytest.raises(AccessDeniedError):
        await view(
            make_stores(settings),
            None,
            url=url,
            output=None,
            open_browser=False,
            max_records=settings.runs.run_max_records,
            auth_token=settings.server.auth_token,
        )


@pytest.mark.anyio
async def test_an_oversized_mcp_request_names_the_limit_and_the_upload_tool(tmp_path: Path) -> None:
    app = build_http_app(make_settings(tmp_path, transport="http"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as client:
        answer = await client.post(
            "/mcp",
            content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"text": "' + b"x" * (5 << 20),
            headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
        )
    assert answer.status_code == 413
    message = answer.json()["error"]["message"]
    assert "4 MiB" in message and "rlm_upload_context" in message and "1 MiB" in message, message


@pytest.mark.anyio
async def test_a_worker_says_it_serves_its_health_check_not_mcp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def ready() -> Readiness:
        return Readiness(ready=True)

    settings = make_settings(tmp_path, port=free_port(), log_level="INFO", role="worker")
    caplog.set_level(logging.INFO, logger="rlm_mcp.server")
    # The test owns the listener: cancelled right after its "serving" line, the server may not
    # have taken the socket over yet.
    with bind_listener(settings.server.host, settings.server.port) as listener:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_http, settings, health_app(ready, role="worker"), listener)
            await wait_until(lambda: "serving" in caplog.text, within_s=60, what="the worker's serving line")
            tg.cancel_scope.cancel()
    base = f"http://127.0.0.1:{settings.server.port}"
    assert f"serving only {base}/healthz and {base}/metrics" in caplog.text  # what a worker answers
    assert "/mcp" not in caplog.text
