"""Writing a container's host frames: straight from the event loop when possible, else a thread.

Small frames are written from the loop when the writer thread is idle (`MSG_DONTWAIT`: never
blocking). The stream is a blocking socket (unix, TCP, an SSH channel...), so the rest goes to a
plain thread of the container's own instead of a slot in anyio's shared worker limiter: a pool
plus batched children would otherwise exhaust the limiter and hang every other blocking call.
Frames go to the attach stream, or to the fast channel's socket once `switch` moved them there.
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.ports.kernel import LoadContextFrame
from rlm_mcp.sandbox.docker.attach import StreamOwner
from rlm_mcp.sandbox.docker.faults import is_lost
from rlm_mcp.sandbox.frames import encode_frame

CHUNK_BYTES = 1 << 20
DIRECT_SEND_MAX = 64 << 10  # frames up to this size may be written from the event loop
ContextJob = tuple[str, int, Path, str]


class FrameWriter:
    """One container's outgoing frames, in order. `start` on the event loop; `stop` ends the thread."""

    def __init__(self, name: str, owner: StreamOwner) -> None:
        self._name = name
        self._owner = owner
        self._lock = threading.Lock()
        self._pending = 0  # jobs queued for or running in the writer thread
        self._jobs: queue.Queue[tuple[Any, Callable[[BaseException | None], None]] | None] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.out: Any = None  # where frames are written
        self.out_plain: socket.socket | None = None  # `out`, when it is a plain socket

    def start(self, raw: Any, plain: socket.socket | None) -> None:
        self._loop = asyncio.get_running_loop()
        self.out, self.out_plain = raw, plain
        threading.Thread(target=self._run, name=f"{self._name}-writer", daemon=True).start()

    def switch(self, sock: socket.socket) -> None:
        """Write to `sock` from now on (nothing may be in flight: the caller knows)."""
        with self._lock:
            self.out = self.out_plain = sock

    def stop(self) -> None:
        self._jobs.put(None)

    async def submit(self, job: bytes | ContextJob) -> None:
        """Write `job` (a frame's bytes, or a context file to send) after those before it."""
        with self._lock:
            if isinstance(job, bytes):
                sent = self._send_now(job)
                if sent == len(job):  # the common case: no event, no closure, no hand-off
                    return
                job = job[sent:]
            loop = self._loop
            assert loop is not None
            done = anyio.Event()
            box: list[BaseException | None] = [None]

            def finished(exc: BaseException | None) -> None:
                box[0] = exc
                try:
                    loop.call_soon_threadsafe(done.set)  # never blocks the writer thread
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    pass

            self._pending += 1
            self._jobs.put((job, finished))
        await done.wait()
        if box[0] is not None:
            raise BrokenPipeError(f"sandbox stdin closed: {box[0]}")

    def _send_now(self, data: bytes) -> int:
        """Bytes of a small frame written straight from the event loop (call under the lock).

        Only when the writer thread has nothing queued (frames stay in order), and never
        blocking (MSG_DONTWAIT): what the socket does not take now goes to the writer thread.
        This spares the common frames (exec, lm_result) two thread hand-offs.
        """
        sock = self.out_plain
        if self._pending or len(data) > DIRECT_SEND_MAX or sock is None:
            return 0
        try:
            return sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise BrokenPipeError(f"sandbox stdin closed: {exc}") from None

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, finished = item
            error: BaseException | None = None
            try:
                if isinstance(job, tuple):
                    self._write_context(*job[1:])
                else:
                    self.out.sendall(job)
            except BaseException as exc:
                error = exc
                if isinstance(exc, OSError) and self._owner.stream_error is None and is_lost(exc):
                    self._owner.stream_error = exc
            with self._lock:  # done with the socket: the loop may write directly again
                self._pending -= 1
            finished(error)

    def _write_context(self, index: int, path: Path, fmt: str) -> None:
        # The frame names the byte count and the file's bytes follow raw: no decoding or JSON
        # escaping here (the kernel decodes once), and sendfile keeps them out of this process.
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self.out.sendall(encode_frame(LoadContextFrame(index=index, format=fmt, bytes=size)))
            if size == 0:
                sent = 0
            elif self.out_plain is not None:
                sent = self.out_plain.sendfile(fh, 0, size)
            else:  # an SSH channel or another socket-like object: plain copies
                sent = 0
                while sent < size and (data := fh.read(min(CHUNK_BYTES, size - sent))):
                    self.out.sendall(data)
                    sent += len(data)
        if sent != size:  # the kernel would wait for the rest forever: end the stream instead
            raise OSError(f"context file {path.name} shrank while it was sent ({sent} of {size} bytes)")
