"""The stdio transport's read end, read on the event loop.

The SDK's `stdio_server()` reads requests through `anyio.wrap_file`: every line is a `readline`
in a worker thread. After each request its reader task hands the next `readline` to a thread
before the request's handler gets the loop (0.2-0.3 ms of the loop's time on a loaded 2-core
host, stamped), and a request's arrival wakes that thread, which then wakes the loop. `PipeIn`
waits for the wire's descriptor to become readable on the loop itself and reads it without
blocking: one wake per request, no thread.

Lines are what the SDK's text wrapper gives: UTF-8 with undecodable bytes replaced, universal
newlines translated to `\\n` (the same incremental decoders `io.TextIOWrapper` uses), each line
with its newline, and a last line without one at end of input.

The SDK skips its own claim of fd 0 when it is given a stream, so `claimed_stdin` does the same
job: the wire moves to a private descriptor and fd 0 reads the null device while serving (a
child process cannot take a request off the wire); fd 0 gets the wire back on exit. Used only
when fd 0 is a pipe or a socket; anything else is read by the SDK's own transport.
"""

from __future__ import annotations

import codecs
import io
import os
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from rlm_mcp.server.stdio_out import claimed

# Bytes asked of the wire per read: a request larger than this (an upload's chunk) takes several.
READ_BYTES = 1 << 16


@contextmanager
def claimed_stdin() -> Iterator[int]:
    """stdin's wire (see `stdio_out.claimed`): fd 0 reads the null device meanwhile."""
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with claimed(0, null) as wire:
            yield wire
    finally:
        os.close(null)


class PipeIn:
    """What the SDK's stdin reader iterates: the wire's lines, as text."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._decoder = io.IncrementalNewlineDecoder(decoder, translate=True)
        self._lines: deque[str] = deque()  # whole lines read, not yet handed out
        self._partial: list[str] = []  # the start of the line being read
        self._eof = False

    def __aiter__(self) -> PipeIn:
        return self

    async def __anext__(self) -> str:
        while not self._lines:
            if self._eof:
                raise StopAsyncIteration
            await self._fill()
        return self._lines.popleft()

    async def _fill(self) -> None:
        """Read what the wire holds (waiting on the loop until it holds something)."""
        while True:
            try:
                data = os.read(self._fd, READ_BYTES)
                break
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
        text = self._decoder.decode(data, final=not data)
        if not data:
            self._eof = True
        *whole, rest = text.split("\n")
        if whole:
            whole[0] = "".join([*self._partial, whole[0]])
            self._partial.clear()
            self._lines.extend(line + "\n" for line in whole)
        if rest:
            self._partial.append(rest)
        if self._eof and self._partial:
            self._lines.append("".join(self._partial))
            self._partial.clear()


__all__ = ["PipeIn", "claimed_stdin"]
