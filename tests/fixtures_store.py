"""Fixtures of the store and loader tests: settings on a temp data dir, and the tests' one
scripted loopback HTTP server (`http_server`: fixed answers by path, for GET and POST)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypedDict

import pytest

from rlm_mcp.config import LoadSettings, Settings, StoreSettings
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.testing.settings import make_settings as make_settings  # re-exported: the one factory


class LoadSections(TypedDict):
    loads: LoadSettings
    store: StoreSettings


def sections(settings: Settings) -> LoadSections:
    """The two sections a loader reads: `load_path(path, **sections(settings))`."""
    return {"loads": settings.loads, "store": settings.store}


@pytest.fixture
def settings_factory(tmp_path: Path) -> Callable[..., Settings]:
    return lambda **overrides: make_settings(tmp_path, **overrides)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir(exist_ok=True)
    return path


# --- a loopback HTTP server ------------------------------------------------------------------

# path -> (status, headers, body, an event the answer waits for: a server that is slow until told)
Route = tuple[int, dict[str, str], bytes, threading.Event | None]


HOLD_LIMIT_S = 60.0  # a held answer that nobody releases still ends (the test then fails on its own)


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, Route] = {}
    seen_hosts: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))  # the same answer, whatever was sent
        self.do_GET()

    def do_GET(self) -> None:
        self.seen_hosts.append(self.headers.get("Host", ""))
        status, headers, body, hold = self.routes.get(
            self.path, (404, {"Content-Type": "text/plain"}, b"not found", None)
        )
        if hold is not None:
            hold.wait(HOLD_LIMIT_S)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if "Content-Length" not in headers and "X-No-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class LoopbackServer:
    def __init__(self) -> None:
        handler: type[_Handler] = type("Handler", (_Handler,), {"routes": {}, "seen_hosts": []})
        self.handler = handler
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        # A short poll interval: shutdown() waits for one poll.
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def route(
        self, path: str, body: bytes, *, status: int = 200, hold: threading.Event | None = None, **headers: str
    ) -> None:
        """Answer `path` with `body`; headers as keywords, `_` for `-` (Content_Type="text/plain").
        With `hold`, the answer waits until the test sets it (at most HOLD_LIMIT_S)."""
        self.handler.routes[path] = (status, {k.replace("_", "-"): v for k, v in headers.items()}, body, hold)

    def redirect(self, path: str, to: str, status: int = 302) -> None:
        self.handler.routes[path] = (status, {"Location": to}, b"", None)


@pytest.fixture
def http_server() -> Iterator[LoopbackServer]:
    server = LoopbackServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def run_record(run_id: str, fields: dict[str, Any] | None = None, *, created_at: float | None = None) -> RunRecord:
    """A run record for store tests, written as the stored JSON's keys (`RunRecord.to_stored`);
    a partial `result` is completed with an answerless run's defaults."""
    data: dict[str, Any] = {"run_id": run_id, "created_at": time.time() if created_at is None else created_at}
    data.update(fields or {})
    result = data.get("result")
    if isinstance(result, dict):
        defaults = {"status": "completed", "answer": None, "reason": None, "run_id": run_id, "iterations": 0}
        data["result"] = defaults | {"usage": {}, "duration_s": 0.0, "sub_calls": 0} | result
    return RunRecord.from_stored(data)


def summary(run_id: str, owner: str = "local", query: str = "q", **fields: Any) -> RunRecord:
    """A queued run's record for the queue's tests (small limits, no context: the enqueue checks the
    owner holds each one the record names, so a test about contexts names its own); `fields` override."""
    limits = {"max_iterations": 5, "max_depth": 1, "timeout_s": 60.0, "token_budget": None, "max_errors": 3}
    stored = {"query": query, "context_ids": [], "owner": owner, "limits": limits, "status": "queued"}
    return run_record(run_id, stored | fields)


def final(run_id: str) -> RunRecord:
    """`summary` of a run that has completed."""
    return summary(run_id, status="completed", result={"status": "completed"})
