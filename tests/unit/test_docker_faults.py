"""Which Docker failures mean "the connection was lost" (retry in a fresh sandbox) and which mean
"the daemon said no" (sandbox/faults.classify). The exceptions come from the real libraries:
docker-py over requests/urllib3 against a loopback unix-socket server that hangs up or answers."""

from __future__ import annotations

import errno
import http.client
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import docker
import docker.errors
import pytest
import requests.exceptions
import urllib3.exceptions

from rlm_mcp.ports.kernel import ExitInfo
from rlm_mcp.sandbox.docker.container import KernelContainer, exit_info_of
from rlm_mcp.sandbox.docker.docker_api import ONE_POOL_KEY, share_one_pool
from rlm_mcp.sandbox.docker.faults import (
    DOCKER_LOST_FIX,
    DockerConnectionLost,
    boot_failure,
    classify,
    is_connection_error,
    lost_error,
)
from rlm_mcp.sandbox.docker.lean_calls import LeanCalls
from tests.fixtures_sandbox import sandbox_settings


class _UnixServer:
    """Accepts connections on a unix socket and hands each to `serve` (one thread each)."""

    def __init__(self, path: Path, serve: Callable[[socket.socket], None]) -> None:
        self.path = path
        self._serve = serve
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        finally:
            conn.close()

    def close(self) -> None:
        self._listener.close()


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


def _hang_up(conn: socket.socket) -> None:
    _read_request(conn)  # then close without a word: a daemon restart, a dropped tunnel


def _half_answer(conn: socket.socket) -> None:
    _read_request(conn)
    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"Id": ')


def _no_space(conn: socket.socket) -> None:
    _read_request(conn)
    body = b'{"message": "no space left on device"}'
    conn.sendall(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )


def _missing(conn: socket.socket) -> None:
    _read_request(conn)
    body = b'{"message": "No such image: rlm-mcp-sandbox:none"}'
    conn.sendall(
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Callable[[Callable[[socket.socket], None]], docker.APIClient]]:
    servers: list[_UnixServer] = []
    clients: list[docker.APIClient] = []

    def make(serve: Callable[[socket.socket], None]) -> docker.APIClient:
        server = _UnixServer(tmp_path / f"d{len(servers)}.sock", serve)
        servers.append(server)
        client = docker.APIClient(base_url=f"unix://{server.path}", version="1.41", timeout=5)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
    for server in servers:
        server.close()


def _raised(call: Callable[[], object]) -> BaseException:
    with pytest.raises(Exception) as raised:
        call()
    return raised.value


def test_a_daemon_that_hangs_up_mid_request_is_a_lost_connection(api: Callable[..., docker.APIClient]) -> None:
    exc = _raised(lambda: api(_hang_up).inspect_container("abc"))
    assert isinstance(exc, requests.exceptions.ConnectionError)
    assert classify(exc) == "lost"


def test_an_answer_cut_short_is_a_lost_connection(api: Callable[..., docker.APIClient]) -> None:
    exc = _raised(lambda: api(_half_answer).inspect_container("abc"))
    assert classify(exc) == "lost", repr(exc)


def test_a_socket_nobody_listens_on_is_a_lost_connection(tmp_path: Path) -> None:
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()  # the path exists, nobody accepts: ECONNREFUSED, as after a daemon stopped
    client = docker.APIClient(base_url=f"unix://{tmp_path / 'dead.sock'}", version="1.41", timeout=5)
    try:
        exc = _raised(lambda: client.inspect_container("abc"))
    finally:
        client.close()
    assert classify(exc) == "lost", repr(exc)
    assert is_connection_error(exc)


def test_the_daemon_saying_no_is_refused_not_lost(api: Callable[..., docker.APIClient]) -> None:
    no_space = _raised(lambda: api(_no_space).inspect_container("abc"))
    assert isinstance(no_space, docker.errors.APIError) and classify(no_space) == "refused"
    missing = _raised(lambda: api(_missing).inspect_image("rlm-mcp-sandbox:none"))
    assert isinstance(missing, docker.errors.ImageNotFound) and classify(missing) == "refused"
    assert not is_connection_error(no_space) and not is_connection_error(missing)


def _lean(client: docker.APIClient) -> LeanCalls:
    assert share_one_pool(SimpleNamespace(api=client))  # as connect_sync does on a unix socket
    return LeanCalls(client, ONE_POOL_KEY)


@pytest.mark.parametrize("serve", [_hang_up, _half_answer])
def test_a_lean_call_that_loses_its_connection_is_a_lost_connection(
    api: Callable[..., docker.APIClient], serve: Callable[[socket.socket], None]
) -> None:
    exc = _raised(lambda: _lean(api(serve)).inspect_container("abc"))
    assert classify(exc) == "lost", repr(exc)
    assert is_connection_error(exc)


def test_a_lean_call_the_daemon_refuses_raises_what_docker_py_raises(api: Callable[..., docker.APIClient]) -> None:
    no_space = _raised(lambda: _lean(api(_no_space)).start("abc"))
    assert isinstance(no_space, docker.errors.APIError) and type(no_space) is docker.errors.APIError
    assert classify(no_space) == "refused" and no_space.status_code == 500 and "no space left" in str(no_space).lower()
    missing = _raised(lambda: _lean(api(_missing)).create_container("rlm-mcp-sandbox:none", name="x"))
    assert isinstance(missing, docker.errors.ImageNotFound) and classify(missing) == "refused"
    assert not is_connection_error(no_space) and not is_connection_error(missing)


def _attach_then_answer(conn: socket.socket) -> None:
    """An attach upgraded as Docker upgrades it, then an echo of what the client writes; any
    other request (on another connection) is answered as an inspect."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    if b"/attach?" not in data:
        body = b'{"Id": "abc", "State": {"Running": true}}'
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
        conn.sendall(head % len(body) + body)  # one answer a connection: this server closes it after
        return
    assert b"Upgrade: tcp" in data and b"stdin=1" in data
    conn.sendall(
        b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
        b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
    )
    while chunk := conn.recv(4096):
        conn.sendall(b"echo:" + chunk)


def test_a_lean_attach_hands_over_the_upgraded_stream_out_of_the_pool(api: Callable[..., docker.APIClient]) -> None:
    lean = _lean(api(_attach_then_answer))
    stream = lean.attach_socket("abc", params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
    raw = getattr(stream, "_sock", stream)
    assert raw.gettimeout() is None  # a stream as long as its container: the event loop may read it
    raw.settimeout(5)
    # Later calls get a connection of their own: the attach's is the stream's, not the pool's.
    assert lean.inspect_container("abc")["Id"] == "abc"
    raw.sendall(b"ping")
    assert raw.recv(100) == b"echo:ping"
    assert lean.inspect_container("abc")["State"]["Running"] is True
    raw.sendall(b"again")
    assert raw.recv(100) == b"echo:again"
    raw.shutdown(socket.SHUT_RDWR)
    stream.close()
    raw.close()  # as `KernelContainer` closes both


def test_a_lean_attach_the_daemon_refuses_raises_what_docker_py_raises(api: Callable[..., docker.APIClient]) -> None:
    missing = _raised(lambda: _lean(api(_missing)).attach_socket("gone", params={"stdin": 1}))
    assert isinstance(missing, docker.errors.NotFound) and classify(missing) == "refused"


def test_a_peer_that_vanished_under_a_raw_stream_is_a_lost_connection() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    with ours, pytest.raises(OSError) as raised:
        for _ in range(64):  # the first send may still be buffered
            ours.sendall(b"x" * 65536)
    assert classify(raised.value) == "lost"


@pytest.mark.parametrize(
    "exc",
    [
        BrokenPipeError(errno.EPIPE, "Broken pipe"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        OSError(errno.ENOTCONN, "Transport endpoint is not connected"),
        OSError(errno.ESHUTDOWN, "Cannot send after transport endpoint shutdown"),
        http.client.RemoteDisconnected("Remote end closed connection without response"),
        http.client.IncompleteRead(b"partial", 10),
        urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError()),
        requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead"),
        requests.exceptions.ReadTimeout("UnixHTTPConnectionPool: Read timed out."),
        docker.errors.DockerException(
            "Error while fetching server API version: ('Connection aborted.', RemoteDisconnected('Remote end'))"
        ),
        DockerConnectionLost("the attach stream failed"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_lost_connections(exc: BaseException) -> None:
    assert classify(exc) == "lost"


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("our own deadline"),  # socket.timeout is TimeoutError too: never guessed as lost
        FileNotFoundError(errno.ENOENT, "a context file that is gone"),
        ValueError("a bug"),
        MemoryError(),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_other_failures_are_not_docker_connection_matters(exc: BaseException) -> None:
    assert classify(exc) == "other"


def test_a_docker_client_error_without_a_connection_cause_is_refused() -> None:
    assert classify(docker.errors.InvalidArgument("bad option")) == "refused"


def test_the_final_error_names_the_lost_connection_and_what_to_check() -> None:
    text = str(lost_error(6, "the attach stream failed: [Errno 104] Connection reset by peer"))
    assert "connection to the Docker daemon was lost" in text and "6 attempts in a row" in text
    assert DOCKER_LOST_FIX in text and "DOCKER_HOST" in text
    for misleading in ("RLM_MCP_SANDBOX_MEMORY", "runs python3", "internal error", "Docker is not running"):
        assert misleading not in text


def test_a_container_ended_by_a_dropped_attach_stream_is_recognised() -> None:
    container = KernelContainer(None, sandbox_settings().sandbox, "owner0123")
    assert container.lost_reason(exit_info_of({"ExitCode": 75, "OOMKilled": False}))  # the kernel saw its stdin close
    assert container.lost_reason(exit_info_of({"ExitCode": 3}))  # the bootstrap saw it close
    assert container.lost_reason(ExitInfo(lost="Connection aborted."))  # inspecting it failed too
    assert container.lost_reason(exit_info_of({"Running": True, "ExitCode": 0}))  # the stream ended, the kernel did not
    assert (
        container.lost_reason(exit_info_of({"Running": False, "ExitCode": 137})) is None
    )  # killed: not the connection
    assert container.lost_reason(exit_info_of({"ExitCode": 0})) is None  # os._exit(0) in user code
    assert container.lost_reason(exit_info_of({"ExitCode": 75, "OOMKilled": True})) is None
    container.stream_error = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    assert container.lost_reason(exit_info_of({"ExitCode": 137}))
    container.close()
    assert container.lost_reason(exit_info_of({"ExitCode": 75})) is None  # we closed it ourselves


def test_a_kernel_that_did_not_start_is_blamed_on_the_right_cause() -> None:
    settings = sandbox_settings()
    killed = str(
        boot_failure("the sandbox closed its output", exit_info_of({"ExitCode": 137}), settings.sandbox, "IMAGE FIX")
    )
    assert "killed by signal 9 while it started" in killed and "IMAGE FIX" not in killed
    oom = str(
        boot_failure(
            "the sandbox closed its output",
            exit_info_of({"ExitCode": 137, "OOMKilled": True}),
            settings.sandbox,
            "IMAGE FIX",
        )
    )
    assert "RLM_MCP_SANDBOX_MEMORY" in oom and "IMAGE FIX" not in oom
    no_python = str(
        boot_failure("the sandbox closed its output", exit_info_of({"ExitCode": 127}), settings.sandbox, "IMAGE FIX")
    )
    assert "exit status 127" in no_python and "IMAGE FIX" in no_python
