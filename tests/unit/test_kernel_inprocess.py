"""The kernel's own logic, run in-process: the parts that need no container (output capture,
clipping, the sub-call waiter). The kernel as a whole runs in real sandboxes in test_sandbox_*."""

from __future__ import annotations

import json
import os
import queue
import struct
import threading

import pytest

from rlm_mcp.sandbox.guest import frames, kernel
from rlm_mcp.sandbox.guest.capture import Capture, TextSink, clip


def test_clip_keeps_head_and_tail_and_counts_the_rest() -> None:
    assert clip("short", 10) == "short"
    clipped = clip("a" * 10 + "b" * 10, 10)
    assert clipped == "aaaaa\n... [10 characters dropped] ...\nbbbbb"


def test_capture_keeps_everything_under_its_cap() -> None:
    capture = Capture(100)
    capture.add(b"hello ")
    capture.add(b"world")
    assert capture.take() == "hello world"
    assert capture.take() == ""  # taking resets it for the next cell


def test_capture_drops_the_middle_of_a_flood_and_says_how_much() -> None:
    capture = Capture(10)  # 5 bytes of head, 5 of tail
    capture.add(b"HEAD!")
    for _ in range(1000):
        capture.add(b"-" * 7)
    capture.add(b"TAIL!")
    assert capture.take() == "HEAD!\n... [7000 bytes of output dropped] ...\nTAIL!"


def test_capture_tail_survives_one_write_bigger_than_the_cap() -> None:
    capture = Capture(10)
    capture.add(b"0123456789abcdefghij")
    assert capture.take() == "01234\n... [10 bytes of output dropped] ...\nfghij"


def test_text_sink_accepts_only_text_like_sys_stdout() -> None:
    capture = Capture(100)
    sink = TextSink(capture, 1)
    assert sink.write("é\n") == 2
    sink.writelines(["a", "b"])
    with pytest.raises(TypeError, match="must be str, not bytes"):
        sink.write(b"raw")
    assert (sink.fileno(), sink.isatty(), sink.writable(), sink.readable()) == (1, False, True, False)
    with pytest.raises(AttributeError):
        sink.detach  # noqa: B018 - no attribute beyond the text-stream surface
    assert capture.take() == "é\nab"


def test_waiter_hands_the_reply_from_the_reader_thread_to_the_caller() -> None:
    waiter = frames.Waiter()
    reply = {"results": ["ok"]}
    reader = threading.Thread(target=waiter.answer, args=(reply,))
    reader.start()
    assert waiter.wait() is reply
    reader.join()


def _frame(obj: dict[str, object]) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def test_reader_splits_frames_and_raw_context_bytes_that_arrive_in_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader takes what the pipe holds in one read: a load_context frame, its raw bytes,
    # the next frames and a lone header byte all land in its buffer together.
    exits: list[int] = []

    def record_exit(code: int) -> None:  # the kernel ends its process on a broken stream
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", record_exit)
    r, w = os.pipe()  # both ends stay open: the reader ends the process when its input closes
    reader = object.__new__(kernel.Kernel)  # only the reader's state, not the process rewiring
    reader.proto_in = r
    reader.tasks = queue.SimpleQueue()
    reader.waiters_lock = threading.Lock()
    waiter = frames.Waiter()
    reader.waiters = {7: waiter}
    reader.in_cell = False
    load = _frame({"type": "load_context", "id": 1, "index": 0, "format": "text", "bytes": 5})
    answer = _frame({"type": "lm_result", "id": 7, "results": ["ok"]})
    cell = _frame({"type": "exec", "id": 2, "code": "x = 1"})
    os.write(w, load + b"h\x00llo" + answer + cell[:1])
    threading.Thread(target=reader.reader, args=(r,), daemon=True).start()
    loaded = reader.tasks.get(timeout=10)
    assert (loaded["type"], bytes(loaded["raw"])) == ("load_context", b"h\x00llo")
    os.write(w, cell[1:])  # the rest of a frame whose first byte came with the others
    assert reader.tasks.get(timeout=10) == {"type": "exec", "id": 2, "code": "x = 1"}
    assert waiter.wait() == {"type": "lm_result", "id": 7, "results": ["ok"]}  # answered before the exec
    assert exits == []
