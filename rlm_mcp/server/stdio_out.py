"""The stdio transport's write end, written on the event loop.

The SDK's `stdio_server()` writes through `anyio.wrap_file`: each answer's `write` and `flush`
run in a worker thread each, two thread hand-offs per answer (on a loaded 2-core host 3-6 ms,
the largest single step of a one-turn run after the model). The SDK takes an explicit `stdout`
(it calls `write` then `flush` on it per message, from its one writer task); `PipeOut` writes
the wire's descriptor without blocking from the event loop, waiting until the pipe has room when
it is full, so a client that reads slowly stalls only the writer task. (The request side:
server/stdio_in.py.)

The SDK skips its own claim of fd 1 when it is given a stream, so `claimed_stdout` does the same
job: the wire moves to a private descriptor and fd 1 points at stderr while serving, so a stray
print or a child process's output goes to stderr instead of tearing a frame; fd 1 gets the wire
back on exit. Used only when fd 1 is a pipe or a socket (what an MCP client starts a server
with); anything else (a terminal, a file) is served by the SDK's own transport.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import anyio


def wire_is_a_stream(fd: int) -> bool:
    """Whether `fd` is a pipe or a socket (how an MCP client connects to a server's stdio)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextmanager
def claimed(fd: int, stand_in: int) -> Iterator[int]:
    """The wire of `fd` on a private, non-blocking descriptor; `fd` is `stand_in`'s duplicate
    meanwhile (stderr, for stdout) and gets the wire back on exit."""
    wire = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        os.dup2(stand_in, fd)
        try:
            os.set_blocking(wire, False)
            yield wire
        finally:
            os.set_blocking(wire, True)  # the flag is the pipe end's, which `fd` gets back
            os.dup2(wire, fd)
    finally:
        os.close(wire)


@contextmanager
def claimed_stdout() -> Iterator[int]:
    """stdout's wire (see `claimed`): fd 1 points at stderr meanwhile."""
    sys.stdout.flush()
    with claimed(1, 2) as wire:
        yield wire


class PipeOut:
    """What the SDK's stdout writer calls, per message: `write` (buffered here), then `flush`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pending: list[bytes] = []

    async def write(self, text: str) -> int:
        self._pending.append(text.encode("utf-8"))
        return len(text)

    async def flush(self) -> None:
        data = b"".join(self._pending)
        self._pending.clear()
        # Shielded: a message stopped half-written would leave a torn frame on the wire (the
        # SDK's threaded write cannot be stopped either).
        with anyio.CancelScope(shield=True):
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self._fd, view) :]
                except BlockingIOError:
                    await anyio.wait_writable(self._fd)


__all__ = ["PipeOut", "claimed", "claimed_stdout", "wire_is_a_stream"]
