"""A cell's output as the host gets it: each stream's head and tail kept, the middle counted and
dropped (`Capture`), Python-level prints straight into it (`TextSink`), and `clip` for the
kernel's own long texts (error messages and tracebacks).

Stdlib only and import-free of the package: its source is sent ahead of kernel.py's (see
bootstrap.kernel_payload) and runs in the kernel's namespace.
"""

import os
import select
import threading
from collections.abc import Iterable
from typing import NoReturn


def clip(text: str, limit: int) -> str:
    """At most about `limit` characters of `text`: head and tail, with the count dropped."""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return text[:half] + f"\n... [{len(text) - 2 * half} characters dropped] ...\n" + text[-half:]


class Capture:
    """Output of one stream for one cell: head and tail kept, the middle counted and dropped."""

    def __init__(self, cap: int) -> None:
        self.lock = threading.Lock()
        self.resize(cap)

    def resize(self, cap: int) -> None:
        with self.lock:
            self.half = max(cap // 2, 1)
            self.reset()

    def reset(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        with self.lock:
            self.total += len(data)
            room = self.half - len(self.head)
            if room > 0:
                self.head += data[:room]
                data = data[room:]
            if data:
                if len(data) >= self.half:
                    self.tail = bytearray(data[-self.half :])
                else:
                    self.tail += data
                    if len(self.tail) > 2 * self.half:  # trim rarely: amortised O(1) per byte
                        del self.tail[: len(self.tail) - self.half]

    def take(self) -> str:
        with self.lock:
            tail = self.tail[-self.half :] if len(self.tail) > self.half else self.tail
            dropped = self.total - len(self.head) - len(tail)
            text = self.head.decode("utf-8", "replace")
            if dropped > 0:
                text += f"\n... [{dropped} bytes of output dropped] ...\n"
            text += bytes(tail).decode("utf-8", "replace")
            self.reset()
            return text


class TextSink:
    """sys.stdout / sys.stderr replacement: Python-level prints go straight to the capture."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, capture: Capture, fileno: int) -> None:
        self._capture = capture
        self._fileno = fileno

    def write(self, text: object) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._capture.add(text.encode("utf-8", "replace"))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fileno

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    @property
    def buffer(self) -> "TextSink":
        return self

    def __getattr__(self, name: str) -> NoReturn:
        raise AttributeError(name)


def read_pipe(fd: int, cap: Capture) -> bool:
    """Move what the pipe holds into `cap`; False once the pipe is closed or broken."""
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except InterruptedError:
            continue
        except OSError:
            return False
        if not data:
            return False
        cap.add(data)


def drain_pipe(fd: int, cap: Capture, lock: threading.Lock) -> None:
    """Keep the pipe flowing while a cell writes more than the pipe buffer holds (a thread's
    body). Bytes leave the pipe only under `lock`, straight into the capture."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        try:
            poller.poll()
        except InterruptedError:
            continue
        with lock:
            if not read_pipe(fd, cap):
                return
