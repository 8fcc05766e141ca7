"""The kernel's own logic, run in-process: the parts that need no container (output capture,
clipping, the sub-call waiter). The kernel as a whole runs in real sandboxes in test_sandbox_*."""

from __future__ import annotations

import threading

import pytest

from rlm_mcp.sandbox.guest import kernel


def test_clip_keeps_head_and_tail_and_counts_the_rest() -> None:
    assert kernel._clip("short", 10) == "short"
    clipped = kernel._clip("a" * 10 + "b" * 10, 10)
    assert clipped == "aaaaa\n... [10 characters dropped] ...\nbbbbb"


def test_capture_keeps_everything_under_its_cap() -> None:
    capture = kernel._Capture(100)
    capture.add(b"hello ")
    capture.add(b"world")
    assert capture.take() == "hello world"
    assert capture.take() == ""  # taking resets it for the next cell


def test_capture_drops_the_middle_of_a_flood_and_says_how_much() -> None:
    capture = kernel._Capture(10)  # 5 bytes of head, 5 of tail
    capture.add(b"HEAD!")
    for _ in range(1000):
        capture.add(b"-" * 7)
    capture.add(b"TAIL!")
    assert capture.take() == "HEAD!\n... [7000 bytes of output dropped] ...\nTAIL!"


def test_capture_tail_survives_one_write_bigger_than_the_cap() -> None:
    capture = kernel._Capture(10)
    capture.add(b"0123456789abcdefghij")
    assert capture.take() == "01234\n... [10 bytes of output dropped] ...\nfghij"


def test_text_sink_accepts_only_text_like_sys_stdout() -> None:
    capture = kernel._Capture(100)
    sink = kernel._TextSink(capture, 1)
    assert sink.write("é\n") == 2
    sink.writelines(["a", "b"])
    with pytest.raises(TypeError, match="must be str, not bytes"):
        sink.write(b"raw")
    assert (sink.fileno(), sink.isatty(), sink.writable(), sink.readable()) == (1, False, True, False)
    with pytest.raises(AttributeError):
        sink.detach  # noqa: B018 - no attribute beyond the text-stream surface
    assert capture.take() == "é\nab"


def test_waiter_hands_the_reply_from_the_reader_thread_to_the_caller() -> None:
    waiter = kernel._Waiter()
    reply = {"results": ["ok"]}
    reader = threading.Thread(target=waiter.answer, args=(reply,))
    reader.start()
    assert waiter.wait() is reply
    reader.join()
