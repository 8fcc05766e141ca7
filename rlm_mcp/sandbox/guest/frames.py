"""The kernel's end of the frame protocol: a frame's bytes, reads that fill a buffer, a waiting sub-call.

Stdlib only and import-free of the package: its source is sent ahead of kernel.py's (see
bootstrap.kernel_payload) and runs in the kernel's namespace. Frames are a 4-byte big-endian
length and UTF-8 JSON (the host's side: sandbox/frames.py).
"""

import json
import os
import struct
import threading
from typing import Any


def encode_frame(obj: Any) -> bytes:
    try:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates in user strings: escape them instead
        data = json.dumps(obj, ensure_ascii=True).encode("ascii")
    return struct.pack(">I", len(data)) + data


def fill(fd: int, buf: bytearray, n: int) -> None:
    """Read until `buf` holds at least `n` bytes. Reads take what the pipe holds (a frame's
    header and body, often several frames, in one read), not one read per header and body."""
    while len(buf) < n:
        data = os.read(fd, min(max(n - len(buf), 1 << 16), 1 << 20))
        if not data:
            raise EOFError
        buf += data


def read_payload(fd: int, buf: bytearray, n: int) -> bytearray:
    # A context's bytes follow its load_context frame raw (no JSON): read straight into one
    # buffer, so a 50 MiB context costs one decode here and no escaping on either side.
    # The first bytes may already be in the reader's buffer `buf` (taken out of it here).
    raw = bytearray(n)
    pos = min(n, len(buf))
    raw[:pos] = buf[:pos]
    del buf[:pos]
    view = memoryview(raw)
    while pos < n:
        got = os.readv(fd, [view[pos : pos + (1 << 22)]])
        if not got:
            raise EOFError
        pos += got
    view.release()
    return raw


class Waiter:
    """One sub-call waiting for the host's reply: the reader thread answers, the caller waits.

    A bare lock held until the answer, not a threading.Event: an Event's wait and set go through
    a Condition written in Python (a lock made per wait, a waiter list), the caller's wake-up
    here is one C-level release. The reader pops a waiter before answering it: one answer each.
    """

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._reply: dict[str, Any] = {}

    def answer(self, reply: dict[str, Any]) -> None:
        self._reply = reply
        self._done.release()

    def wait(self) -> dict[str, Any]:
        self._done.acquire()
        return self._reply
