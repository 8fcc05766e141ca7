"""Reading a container's attach stream: Docker's stream framing, then the kernel's frames.

`plain_socket` is the one rule for how: a plain blocking unix/TCP socket is read on the event
loop itself (`LoopReader`: no thread, no wake-up through the loop's self-pipe per frame); any
other stream (TLS, an SSH channel, a socket with a timeout) by a dedicated thread
(`ThreadReader`). Both decode with `AttachDemux`, apply the same frame limits and end the same
way; the inbox budget holds back a flood on both (the thread blocks, the loop stops reading).
The fast channel's unix socket (fastchan.py) carries the kernel's frames without Docker's
framing: `LoopReader` reads it too, through `RawDemux`, with the same limits, inbox and budget.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rlm_mcp.ports.kernel import ChannelEvent
from rlm_mcp.sandbox.frames import FrameDecoder, ProtocolViolation, Reserve, decode_kernel_frame
from rlm_mcp.sandbox.inbox import ByteBudget, Inbox

RECV_BYTES = 1 << 18
STDERR_KEEP = 8 << 10
# Frames up to this size are parsed on the event loop (0.3-0.6 ms at 64 KiB on the 2-core dev VM,
# against ~0.1 ms of CPU and two wake-ups to hand one to a worker thread and back; nearly every
# frame is far smaller). Past it a parse grows with the frame (~3 ms at 256 KiB, seconds near the
# cap), so it runs in a worker thread: its C passes each hold the GIL, but the loop runs between them.
LOOP_PARSE_MAX = 64 << 10
EOF_DETAIL = "the sandbox closed its output"
_DOCKER_HEADER = struct.Struct(">BxxxI")
EndKind = Literal["eof", "violation"]


def plain_socket(raw: Any) -> socket.socket | None:
    """`raw` when the event loop can read it directly, else None (then a thread reads it).

    Only an exact `socket.socket` (an SSLSocket buffers decrypted bytes the loop cannot see;
    docker's SSHSocket pipes through a subprocess, its fd is not the stream), a stream on unix or
    TCP, and blocking (no timeout): `MSG_DONTWAIT` then makes each loop-side call non-blocking
    while the writer thread's `sendall` still blocks.
    """
    if type(raw) is not socket.socket:
        return None
    if raw.family not in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6) or raw.type != socket.SOCK_STREAM:
        return None
    return raw if raw.gettimeout() is None else None


class StreamOwner(Protocol):
    """What a reader reports on: the container whose stream it reads."""

    eof: bool
    stream_error: BaseException | None


class AttachDemux:
    """Docker's multiplexed stream (8-byte headers: stream number, length) split into the
    kernel's frame payloads (stdout, through `FrameDecoder`) and the first bytes of stderr."""

    def __init__(self, max_frame: int, reserve: Reserve) -> None:
        self.frames = FrameDecoder(max_frame, reserve=reserve)
        self.stderr = bytearray()
        self._header = bytearray()
        self._need = 0  # bytes left of the current Docker frame
        self._stream = 0

    def feed(self, data: bytes | memoryview) -> tuple[list[bytearray], int]:
        """The frame payloads `data` completes, and how many of its bytes were taken: fewer than
        all when the budget refused a frame (`frames.waiting`): feed the rest again later."""
        view = memoryview(data)
        total = len(view)
        out: list[bytearray] = []
        while view:
            if self._need == 0:
                take = min(8 - len(self._header), len(view))
                self._header += view[:take]
                view = view[take:]
                if len(self._header) == 8:
                    self._stream, self._need = _DOCKER_HEADER.unpack(self._header)
                    self._header.clear()
                continue
            take = min(self._need, len(view))
            if self._stream == 1:
                out += self.frames.feed(view[:take])
                take -= self.frames.left
                if self.frames.waiting:
                    self._need -= take
                    return out, total - len(view) + take
            elif self._stream == 2 and len(self.stderr) < STDERR_KEEP:
                self.stderr += view[: min(take, STDERR_KEEP - len(self.stderr))]
            view = view[take:]
            self._need -= take
        return out, total


class RawDemux:
    """The fast channel's stream: the kernel's frames alone (no Docker headers, no stderr)."""

    def __init__(self, max_frame: int, reserve: Reserve) -> None:
        self.frames = FrameDecoder(max_frame, reserve=reserve)
        self.stderr = bytearray()  # always empty: the kernel's stderr stays on the attach stream

    def feed(self, data: bytes | memoryview) -> tuple[list[bytearray], int]:
        """As `AttachDemux.feed`."""
        out = self.frames.feed(data)
        return out, len(data) - self.frames.left


class AttachReader(Protocol):
    demux: AttachDemux | RawDemux

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def consumed(self) -> None:
        """The session took an event from the inbox (its budget was released)."""


def open_reader(
    raw: Any, name: str, owner: StreamOwner, inbox: Inbox, budget: ByteBudget, max_frame: int, max_strings: int
) -> AttachReader:
    """The reader for this stream (`plain_socket` decides which); call on the event loop."""
    ends = ReaderEnds(asyncio.get_running_loop(), owner, inbox, budget, max_frame, max_strings)
    sock = plain_socket(raw)
    if sock is not None:
        return LoopReader(sock, ends)
    return ThreadReader(raw, name, ends)


@dataclass(frozen=True)
class ReaderEnds:
    """What either reader reports to (the loop, the container, its inbox and budget) and the
    frame limits it applies."""

    loop: asyncio.AbstractEventLoop
    owner: StreamOwner
    inbox: Inbox
    budget: ByteBudget
    max_frame: int
    max_strings: int


class _Reader:
    """The ends both readers share."""

    def __init__(self, ends: ReaderEnds) -> None:
        self._loop = ends.loop
        self._owner = ends.owner
        self._inbox = ends.inbox
        self._budget = ends.budget
        self._max_strings = ends.max_strings


class LoopReader(_Reader):
    """Reads the stream in event-loop callbacks (`add_reader`, `recv(MSG_DONTWAIT)`).

    Small frames are parsed in the callback and put in the inbox directly. A frame over
    LOOP_PARSE_MAX goes to a worker thread; reading pauses until it is back, so order holds.
    When the budget refuses the next frame's buffer, reading stops (the unread bytes stay in
    the socket, the kernel blocks writing) until the session consumes (`consumed`).
    """

    def __init__(self, sock: socket.socket, ends: ReaderEnds, raw: bool = False) -> None:
        super().__init__(ends)
        self._sock = sock
        self._fd = sock.fileno()
        demux = RawDemux if raw else AttachDemux
        self.demux: AttachDemux | RawDemux = demux(ends.max_frame, ends.budget.try_acquire)
        self._backlog = memoryview(b"")  # received bytes not yet decoded (the budget was full)
        self._pending: collections.deque[bytearray] = collections.deque()  # decoded, not parsed
        self._watching = False
        self._parsing = False
        self.stalled = False  # waiting for the session to consume
        self._done = False

    def start(self) -> None:
        self._pump()

    def stop(self) -> None:
        """Stop reading; the caller closes the socket after. Idempotent."""
        self._done = True
        self._unwatch()

    def consumed(self) -> None:
        if self.stalled and not self._done:
            self.stalled = False
            self._pump()

    def _watch(self) -> None:
        if not self._watching:
            self._loop.add_reader(self._fd, self._on_readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            try:
                self._loop.remove_reader(self._fd)
            except Exception:  # the loop is closed already: nothing is watching any more
                pass

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._owner.stream_error = exc
            self._finish("eof", f"the attach stream failed ({exc})")
            return
        if not data:
            self._finish("eof", EOF_DETAIL)
            return
        self._backlog = memoryview(data)
        self._pump()

    def _pump(self) -> None:
        """Move things on as far as the budget allows, then watch the socket, or stay paused."""
        try:
            while not self._done:
                if self._pending:
                    payload = self._pending.popleft()
                    if len(payload) > LOOP_PARSE_MAX:
                        self._parse_aside(payload)
                        return
                    frame, cost = decode_kernel_frame(payload, self._max_strings)
                    self._deliver(ChannelEvent("frame", frame, size=cost), len(payload))
                elif self._backlog:
                    payloads, used = self.demux.feed(self._backlog)
                    self._backlog = self._backlog[used:]
                    self._pending.extend(payloads)
                    if self.demux.frames.waiting and not payloads:
                        self.stalled = True
                        self._unwatch()
                        return
                else:
                    self._watch()
                    return
        except ProtocolViolation as exc:
            self._finish("violation", str(exc))
        except Exception as exc:  # anything unexpected ends this container, never the server
            self._finish("violation", f"unreadable output ({type(exc).__name__}: {exc})")

    def _deliver(self, event: ChannelEvent, wire_size: int) -> None:
        # The buffer is gone, the parsed frame is charged (it exists either way: the budget's
        # refusals of later buffers are the back-pressure).
        self._budget.release(wire_size)
        self._budget.charge(event.size)
        self._inbox.put(event)

    def _parse_aside(self, payload: bytearray) -> None:
        self._parsing = True
        self._unwatch()
        try:
            future = self._loop.run_in_executor(None, decode_kernel_frame, payload, self._max_strings)
        except RuntimeError as exc:  # the loop's executor is shut down: the server is stopping
            self._finish("eof", f"the attach stream failed ({exc})")
            return
        size = len(payload)
        future.add_done_callback(lambda done: self._parsed(done, size))

    def _parsed(self, done: asyncio.Future[Any], size: int) -> None:
        self._parsing = False
        if self._done:
            return
        exc = done.exception() if not done.cancelled() else asyncio.CancelledError()
        if isinstance(exc, ProtocolViolation):
            self._finish("violation", str(exc))
        elif exc is not None:
            self._finish("violation", f"unreadable output ({type(exc).__name__}: {exc})")
        else:
            frame, cost = done.result()
            self._deliver(ChannelEvent("frame", frame, size=cost), size)
            self._pump()

    def _finish(self, kind: EndKind, detail: str) -> None:
        if self._done:
            return
        self._done = True
        self._unwatch()
        self._owner.eof = True
        self._inbox.put(ChannelEvent(kind, detail=detail))


def open_raw_reader(
    sock: socket.socket, owner: StreamOwner, inbox: Inbox, budget: ByteBudget, max_frame: int, max_strings: int
) -> LoopReader:
    """The fast channel's reader (a blocking unix socket, read on the event loop)."""
    ends = ReaderEnds(asyncio.get_running_loop(), owner, inbox, budget, max_frame, max_strings)
    return LoopReader(sock, ends, raw=True)


class ThreadReader(_Reader):
    """Reads the stream with blocking `recv` in a dedicated thread (not anyio's shared worker
    limiter: a pool plus batched children would exhaust it), handing each event to the loop
    with `call_soon_threadsafe`. Each frame's buffer waits for the budget (the thread blocks)."""

    def __init__(self, raw: Any, name: str, ends: ReaderEnds) -> None:
        super().__init__(ends)
        self._raw = raw
        self._name = name
        self.demux: AttachDemux | RawDemux = AttachDemux(ends.max_frame, ends.budget.acquire)

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"{self._name}-reader", daemon=True).start()

    def stop(self) -> None:
        """Nothing to do: closing the budget and the socket ends the thread."""

    def consumed(self) -> None:
        """Nothing to do: the budget's release wakes the thread."""

    def _run(self) -> None:
        kind: EndKind = "eof"
        detail = EOF_DETAIL
        try:
            while True:
                data = self._raw.recv(RECV_BYTES)
                if not data:
                    break
                payloads, _ = self.demux.feed(data)
                if self.demux.frames.waiting:  # only when the budget closed: the container is closed
                    return
                while payloads:
                    payload = payloads.pop(0)  # out of the list, so its buffer goes once parsed
                    size = len(payload)
                    # Queued at its parsed size, not its wire size (see parse_kernel_frame_sized).
                    frame, cost = decode_kernel_frame(payload, self._max_strings)
                    del payload
                    self._budget.release(size)  # the buffer is gone; the parsed frame is charged
                    if not self._deliver(ChannelEvent("frame", frame, size=cost)):
                        return
        except ProtocolViolation as exc:
            kind, detail = "violation", str(exc)
        except OSError as exc:
            self._owner.stream_error = exc
            detail = f"the attach stream failed ({exc})"
        except Exception as exc:  # anything unexpected ends this container, never the server
            kind, detail = "violation", f"unreadable output ({type(exc).__name__}: {exc})"
        self._owner.eof = True
        self._deliver(ChannelEvent(kind, detail=detail))

    def _deliver(self, event: ChannelEvent) -> bool:
        if not self._budget.acquire(event.size):
            return False
        try:
            self._loop.call_soon_threadsafe(self._inbox.put, event)  # never blocks the reader thread
            return True
        except RuntimeError:  # the loop is closed
            return False
