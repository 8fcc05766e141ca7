"""Issue 24: rootless Podman (or Docker) on cgroup v1 cannot enforce the sandbox's limits, so
`rlm-mcp serve` refuses to start there, with the reason and the fix; an engine that cannot be
reached still does not stop the start (the first run says why).

The server is the real CLI; the engine is a loopback unix-socket HTTP server that answers the
Docker API's /_ping, /version and /info with what rootless Podman 4.3 sends on cgroup v1
(tests/unit/test_engine_detection.py), which CI (root, cgroup v2 or v1) cannot run itself.
"""

from __future__ import annotations

import json
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.fixtures_sandbox import PODMAN_INFO, PODMAN_VERSION


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _engine_handler(info: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    class Engine(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path.endswith("/_ping"):
                self._send(b"OK", "text/plain")
            elif path.endswith("/version"):
                self._send(json.dumps({**PODMAN_VERSION, "ApiVersion": "1.41"}).encode(), "application/json")
            elif path.endswith("/info"):
                self._send(json.dumps(info).encode(), "application/json")
            else:
                self._send(b'{"message": "not here"}', "application/json", status=404)

        def _send(self, body: bytes, kind: str, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self) -> str:  # a unix socket has no peer address
            return "unix"

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Engine


@pytest.fixture
def engine_at(tmp_path: Path) -> Iterator[Any]:
    servers: list[_UnixHTTPServer] = []

    def start(info: dict[str, Any]) -> str:
        path = tmp_path / f"engine{len(servers)}.sock"
        server = _UnixHTTPServer(str(path), _engine_handler(info))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"unix://{path}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _serve(tmp_path: Path, docker_host: str) -> subprocess.CompletedProcess[str]:
    """`rlm-mcp serve` on stdio with stdin closed: it starts, reads EOF and exits 0 — unless the
    start is refused."""
    env = cli_env(tmp_path, DOCKER_HOST=docker_host, RLM_MCP_BASE_URL="http://127.0.0.1:9/v1")
    return subprocess.run(
        [str(SERVER_SCRIPT), "serve"],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rootless_podman_on_cgroup_v1_stops_the_start(tmp_path: Path, engine_at: Any) -> None:
    done = _serve(tmp_path, engine_at({**PODMAN_INFO, "Rootless": True}))
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("rlm-mcp:")]
    assert len(lines) == 1, done.stderr
    assert "Rootless Podman on cgroup v1 cannot enforce the sandbox's memory, pids and CPU limits" in lines[0]
    assert "podman system service" in lines[0] and "cgroup v2" in lines[0]  # the fix


def test_a_rootful_engine_and_an_unreachable_one_start(tmp_path: Path, engine_at: Any) -> None:
    for docker_host in (engine_at(PODMAN_INFO), f"unix://{tmp_path}/nothing-listens.sock"):
        done = _serve(tmp_path, docker_host)
        assert done.returncode == 0, (docker_host, done.stderr[-3000:])
        assert "cgroup v1" not in done.stderr
