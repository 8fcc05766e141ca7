"""A connection attempt to PostgreSQL that the process gives up on (its connect timeout, or a
cancellation such as the pool's own close) closes its socket at once, not when Python's cycle
collector gets to it. Until the client's socket closes, the server's backend for it waits in
authentication for `authentication_timeout` (60 s by default): it holds a connection slot, and
every statement that waits for all backends (DROP DATABASE ... WITH (FORCE), for one) waits with
it. psycopg keeps the half-made connection referenced from the failed attempt's frames, which the
error it raises keeps alive, and the caller keeps the error (a tool error, a log line).

The server here is a loopback socket that accepts and never answers: every attempt stays mid
handshake until the client gives up, and the test sees the moment the client's socket closes."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import rlm_mcp
import rlm_mcp.store.pg.db as pg_db
from rlm_mcp.store.pg.connect import Connection
from rlm_mcp.store.pg.db import Database, DatabaseUnavailableError
from rlm_mcp.testing.waiting import wait_until

pytestmark = pytest.mark.anyio


class SilentServer:
    """Accepts connections on loopback, never answers; counts the clients still connected."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self.accepted = 0
        self.open = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(0.05)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with conn:
            while conn.recv(4096):  # what the client sends is read and never answered
                pass
        with self._lock:
            self.open -= 1  # the client closed its end

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def url(port: int) -> str:
    return f"postgresql://rlm:secret@127.0.0.1:{port}/rlm?sslmode=disable"


async def test_a_first_connection_that_times_out_closes_its_socket(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_db, "CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(DatabaseUnavailableError) as caught:
        await Database(url(silent.port), replica=False).prepare()
    assert "is unreachable" in caught.value.cause
    assert silent.accepted == 1
    # The error is still held here, as a caller holds it while it answers or logs it.
    await wait_until(lambda: silent.open == 0, within_s=10, what="the timed-out attempt to close its socket")


async def test_the_pools_attempts_close_their_sockets(silent: SilentServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_db, "CONNECT_TIMEOUT_S", 1.0)
    db = Database(url(silent.port), replica=False)
    await db.pool.open(wait=False)
    try:
        await wait_until(lambda: silent.accepted >= 1, what="the pool to start connecting")
    finally:
        with anyio.fail_after(10):
            await db.close()  # waits for the attempt in flight to time out
    await wait_until(lambda: silent.open == 0, within_s=5, what="the pool's attempts to close their sockets")


async def test_a_cancelled_attempt_closes_its_socket(silent: SilentServer) -> None:
    with pytest.raises(TimeoutError) as caught:  # held, as a caller holds the error it reports
        with anyio.fail_after(2):  # the server accepts and says nothing: still connecting then
            await Connection.connect(url(silent.port), connect_timeout=10)
    assert caught.value.__context__ is not None  # the cancellation, and the frames it came through
    await wait_until(lambda: silent.accepted == 1, what="the server to count the attempt it accepted")
    await wait_until(lambda: silent.open == 0, within_s=5, what="the cancelled attempt to close its socket")


def test_every_connection_the_product_opens_goes_through_connect_py() -> None:
    """The pool, the first connection, the LISTEN loops, `status` and `doctor`: a connection
    opened with psycopg's own `connect` would leave its abandoned attempts open again."""
    package = Path(rlm_mcp.__file__).parent
    direct = re.compile(r"\bpsycopg\.(?:AsyncConnection\.|Connection\.)?connect\(")
    offenders = [
        f"{path.relative_to(package.parent)}:{number}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "connect.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if direct.search(line)
    ]
    assert not offenders, f"use rlm_mcp.store.pg.connect.Connection.connect: {offenders}"
