"""The attach stream's two readers (rlm_mcp/sandbox/docker/attach.py) under the same hostile input.

No Docker: a socketpair stands in for the attach socket, and the test writes Docker's stream
framing into it as the daemon would. A plain socket is read on the event loop; the same socket
behind a wrapper object (as an SSH channel is) is read by a thread. Every case runs on both.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from rlm_mcp.ports.kernel import ChannelEvent, ExecResultFrame, LMRequestFrame, LogFrame
from rlm_mcp.sandbox.docker import attach
from rlm_mcp.sandbox.docker.attach import LOOP_PARSE_MAX, LoopReader, ThreadReader, plain_socket
from rlm_mcp.sandbox.docker.container import KernelContainer
from rlm_mcp.sandbox.inbox import ByteBudget
from tests.fixtures_sandbox import sandbox_settings

pytestmark = pytest.mark.anyio


class Wrapped:
    """A socket behind an object that is not a socket (what a paramiko channel looks like)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()


class SendTakesNoFlags(socket.socket):
    """A socket subclass whose send takes no flags and whose fd is not the stream, as docker's
    SSHSocket (it pipes through an ssh process): only its own methods may be used."""

    def __init__(self, peer: socket.socket) -> None:
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.peer = peer

    def send(self, data: Any) -> int:  # type: ignore[override]
        return self.peer.send(data)

    def sendall(self, data: Any) -> None:  # type: ignore[override]
        self.peer.sendall(data)

    def recv(self, n: int) -> bytes:  # type: ignore[override]
        return self.peer.recv(n)

    def close(self) -> None:
        self.peer.close()
        super().close()


class WatchedBudget(ByteBudget):
    """A ByteBudget that records its peak and whether it ever refused or made a reader wait."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.peak = 0
        self.refused = threading.Event()

    def _full(self, n: int) -> bool:
        return bool(self._used and self._used + n > self._limit)

    def acquire(self, n: int) -> bool:
        if self._full(n):
            self.refused.set()
        ok = super().acquire(n)
        self.peak = max(self.peak, self._used)
        return ok

    def try_acquire(self, n: int) -> bool:
        ok = super().try_acquire(n)
        if not ok:
            self.refused.set()
        self.peak = max(self.peak, self._used)
        return ok

    def charge(self, n: int) -> None:
        super().charge(n)
        self.peak = max(self.peak, self._used)


def frame(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def docker(stream: int, data: bytes, piece: int = 1 << 16) -> bytes:
    """`data` as Docker frames it on an attach stream, in pieces of `piece` bytes."""
    return b"".join(
        struct.pack(">BxxxI", stream, len(data[i : i + piece])) + data[i : i + piece]
        for i in range(0, len(data), piece)
    )


def log(message: str) -> bytes:
    return frame({"type": "log", "id": 0, "message": message})


def exec_result(fid: int, stdout: str) -> bytes:
    return frame(
        {"type": "exec_result", "id": fid, "stdout": stdout, "stderr": "", "variables": ["x"], "duration": 0.5}
    )


@pytest.fixture(params=["loop", "thread"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[KernelContainer, socket.socket, socket.socket]]:
    """A container (not yet reading), our end of a socketpair and the daemon's end."""
    mine, other = socket.socketpair()
    container = KernelContainer(None, sandbox_settings().sandbox, "owner0123")
    try:
        yield container, mine, other
    finally:
        container.close()
        other.close()
        mine.close()


Pair = tuple[KernelContainer, socket.socket, socket.socket]


def open_on(container: KernelContainer, path: str, sock: socket.socket) -> None:
    container.open_stream(sock if path == "loop" else Wrapped(sock))


async def events(container: KernelContainer) -> list[ChannelEvent]:
    out: list[ChannelEvent] = []
    with anyio.fail_after(30):
        while not out or out[-1].kind == "frame":
            out.append(await container.receive())
    return out


def feed_in_thread(sock: socket.socket, data: bytes, close: bool = True) -> threading.Thread:
    def run() -> None:
        try:
            for i in range(0, len(data), 7919):  # odd pieces: headers and frames split anywhere
                sock.sendall(data[i : i + 7919])
            if close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:  # the reader closed its end: the test says what it expected
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_the_reader_is_chosen_by_the_socket(pair: Pair, path: str) -> None:
    container, mine, _ = pair
    sock = socket.socket()
    try:
        assert plain_socket(sock) is sock
        sock.settimeout(5)  # a timeout makes MSG_DONTWAIT calls wait: the thread reads it
        assert plain_socket(sock) is None
    finally:
        sock.close()
    open_on(container, path, mine)
    assert isinstance(container._reader, LoopReader if path == "loop" else ThreadReader)


async def test_frames_arrive_in_order_small_and_big(pair: Pair, path: str) -> None:
    container, mine, other = pair
    big = "y" * (3 * LOOP_PARSE_MAX)  # parsed in a worker thread on the loop path
    stdout = log("one") + exec_result(1, big) + log("two") + exec_result(2, "small") + log("three")
    data = docker(2, b"warning on stderr\n") + docker(1, stdout, piece=5000) + docker(2, b"more\n")
    open_on(container, path, mine)
    sender = feed_in_thread(other, data)
    got = await events(container)
    sender.join()
    kinds = [e.frame for e in got[:-1]]
    assert [type(f) for f in kinds] == [LogFrame, ExecResultFrame, LogFrame, ExecResultFrame, LogFrame]
    assert isinstance(kinds[1], ExecResultFrame) and kinds[1].stdout == big
    assert got[-1].kind == "eof" and got[-1].detail == attach.EOF_DETAIL and container.eof
    assert container.stderr_tail() == "warning on stderr\nmore\n"


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        (b"\x00\x00\x00\x05hello", "a frame that does not begin with its type"),
        (struct.pack(">I", 200_000) + b'{"type":"log","message":"' + b"x" * 100, "a log frame of 200000 bytes"),
        (struct.pack(">I", 1 << 31), "a frame of 2147483648 bytes"),
        (frame({"type": "nope", "id": 1}), "an unknown frame type 'nope'"),
        (frame({"type": "exec_result", "id": 1, "stdout": 5}), "stdout is not a string"),
        (exec_result(1, "z" * (2 * LOOP_PARSE_MAX))[:-1] + b"]", "not UTF-8 JSON"),
    ],
)
async def test_hostile_output_is_a_violation(pair: Pair, path: str, stdout: bytes, expected: str) -> None:
    container, mine, other = pair
    open_on(container, path, mine)
    sender = feed_in_thread(other, docker(1, log("first") + stdout), close=False)
    got = await events(container)
    sender.join()
    # The log before it arrives or not (it was in the same read): the stream ends there either way.
    assert all(isinstance(e.frame, LogFrame) for e in got[:-1])
    assert got[-1].kind == "violation" and expected in got[-1].detail, got[-1].detail


async def test_eof_mid_frame_and_a_stderr_flood(pair: Pair, path: str) -> None:
    container, mine, other = pair
    open_on(container, path, mine)
    data = docker(2, b"e" * (4 << 20)) + docker(1, log("ok")) + docker(1, exec_result(3, "cut")[:30])
    sender = feed_in_thread(other, data)
    got = await events(container)
    sender.join()
    assert [e.kind for e in got] == ["frame", "eof"] and got[-1].detail == attach.EOF_DETAIL
    assert container.stderr_tail() == "e" * attach.STDERR_KEEP  # kept capped


async def test_a_flood_waits_for_the_session(pair: Pair, path: str) -> None:
    """The reader stops taking bytes once its budget is full; nothing is lost or reordered."""
    container, mine, other = pair
    budget = container._budget = WatchedBudget(1 << 20)
    open_on(container, path, mine)
    prompt = "p" * 40_000
    count = 300  # 12 MB of prompts: far past the budget and the socket's buffers
    request = [frame({"type": "lm_request", "id": i, "kind": "llm", "prompts": [prompt]}) for i in range(count)]
    sender = feed_in_thread(other, docker(1, b"".join(request)))
    with anyio.fail_after(30):
        while not budget.refused.is_set():
            await anyio.sleep(0.01)
    assert sender.is_alive()  # it cannot finish while nobody consumes
    got = await events(container)
    sender.join()
    ids = [e.frame.id for e in got[:-1] if isinstance(e.frame, LMRequestFrame)]
    assert ids == list(range(count)) and got[-1].kind == "eof"
    cost = max(e.size for e in got)
    assert budget.peak <= (1 << 20) + cost + attach.RECV_BYTES * 5


async def test_close_stops_reading_and_closes_the_socket(pair: Pair) -> None:
    container, mine, other = pair
    fd = mine.fileno()
    container.open_stream(mine)
    big = exec_result(9, "q" * (4 * LOOP_PARSE_MAX))
    sender = feed_in_thread(other, docker(1, log("a") + big), close=False)
    assert isinstance((await container.receive()).frame, LogFrame)
    container.close()  # perhaps while the big frame is being parsed aside: it is dropped
    assert mine.fileno() == -1
    loop = container._loop
    assert not loop.remove_reader(fd)  # nothing watches the closed fd
    sender.join()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed, not leaked (no other fd was opened since)


async def test_a_socket_subclass_is_written_through_its_own_methods(
    pair: Pair,
) -> None:
    """Before the fix, the direct write called send(data, MSG_DONTWAIT) on any socket subclass:
    docker's SSHSocket takes no flags (TypeError on every small frame), an SSLSocket refuses them."""
    container, mine, other = pair
    odd = SendTakesNoFlags(mine)
    container.open_stream(odd)
    assert isinstance(container._reader, ThreadReader)
    await container.send_raw(b"hello")
    with anyio.fail_after(10):
        assert await anyio.to_thread.run_sync(other.recv, 16) == b"hello"
