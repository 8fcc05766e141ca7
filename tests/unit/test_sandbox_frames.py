"""The host's parsing of kernel frames: hostile payloads must not cost more than their size."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlm_mcp.ports.kernel import ExecResultFrame
from rlm_mcp.sandbox import frames
from rlm_mcp.sandbox.frames import (
    FrameDecoder,
    ProtocolViolation,
    encode,
    max_frame_strings,
    max_kernel_frame,
    parse_kernel_frame_sized,
)

CAP = max_kernel_frame(1 << 20, 8 << 20)


def parse_kernel_frame(payload: bytes | bytearray) -> dict:
    """The frame as the container's reader parses it (at the default batch cap)."""
    return parse_kernel_frame_sized(payload, max_frame_strings(512))[0]


def _padded(head: bytes, item: bytes, tail: bytes, size: int) -> bytes:
    return head + item * ((size - len(head) - len(tail)) // len(item)) + tail


@pytest.mark.parametrize(
    "payload",
    [
        # ~20 M empty lists in an unknown key of a log frame: 1.5 GB of host memory and ~13 s
        # of GIL held by json.loads (the event loop frozen) before the fix.
        _padded(b'{"type":"log","id":1,"message":"","pad":[', b"[],", b"[]]}", 30 << 20),
        # A schema-valid lm_request with ~6 M two-character prompts: ~12x its size once parsed.
        _padded(b'{"type":"lm_request","id":1,"kind":"llm","model":null,"prompts":[', b'"ab",', b'"x"]}', 30 << 20),
        # Millions of small numbers and constants.
        _padded(b'{"type":"log","id":1,"message":"","pad":[', b"1.5,null,", b"0]}", 30 << 20),
    ],
    ids=["empty_lists", "short_strings", "scalars"],
)
def test_amplifying_frames_are_refused_cheaply(payload: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(payload) < CAP

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("json.loads ran on an amplifying frame")

    # Cheap means refused by the shape check, before json.loads builds millions of objects.
    monkeypatch.setattr(frames, "json", SimpleNamespace(loads=no_parse))
    with pytest.raises(ProtocolViolation):
        parse_kernel_frame(payload)


def test_big_legitimate_frames_still_parse() -> None:
    tricky = 'a "quoted" \\ back\\\\slash \\" [1, {2}] , : \x00\x1f é ✓ 😀\n'
    stdout = (tricky * 40_000)[: 1 << 20]
    frame = {
        "type": "exec_result",
        "id": 7,
        "stdout": stdout,
        "stderr": "\\" * 500_000 + '"',
        "error": None,
        "answer": {"content": tricky * 100_000, "ready": True},
        "variables": [f"v{i}" for i in range(1000)],
        "duration": 0.5,
        "interrupted": False,
    }
    data = encode(frame)
    assert len(data) > 8 << 20
    (payload,) = FrameDecoder(CAP).feed(data)
    assert parse_kernel_frame(payload) == frame
    # The kernel's own encoding (ensure_ascii=False, default separators) and ASCII escapes.
    for ascii_only in (False, True):
        request = {"type": "lm_request", "id": 3, "kind": "rlm", "prompts": [tricky * 100] * 512, "model": None}
        assert parse_kernel_frame(json.dumps(request, ensure_ascii=ascii_only).encode()) == request


def test_small_frame_types_are_capped_from_their_first_bytes() -> None:
    reserved: list[int] = []

    def reserve(size: int) -> bool:
        reserved.append(size)
        return True

    decoder = FrameDecoder(CAP, reserve=reserve)
    header = (60_000_000).to_bytes(4, "big")
    with pytest.raises(ProtocolViolation, match="log frame of 60000000 bytes"):
        decoder.feed(header + b'{"type": "log", "id": 0, "message": "' + b"x" * 100)
    assert reserved == []  # refused on its first 64 bytes: no reservation, no 60 MB buffer
    legal = encode({"type": "exec_result", "id": 1, "stdout": "y" * 1000})
    FrameDecoder(CAP, reserve=reserve).feed(legal[:70])
    assert reserved == [len(legal) - 4]  # a legal frame is reserved once its type is known
    with pytest.raises(ProtocolViolation, match="does not begin with its type"):
        FrameDecoder(CAP).feed((200).to_bytes(4, "big") + b'{"id": 0, "type": "log", "message": "' + b"x" * 100)
    smuggled = b'{"type":"exec_result","id":1,"message":"","type":"log"}'
    with pytest.raises(ProtocolViolation, match="not the one it begins with"):
        parse_kernel_frame(smuggled)
    # Several small frames in one read come out whole, in order.
    frames = [{"type": "log", "id": 0, "message": str(i)} for i in range(3)]
    assert [parse_kernel_frame(p) for p in FrameDecoder(CAP).feed(b"".join(encode(f) for f in frames))] == frames


def test_every_string_from_the_sandbox_is_valid_text() -> None:
    """A lone UTF-16 surrogate (one line of model code, or half an emoji copied from a JSON context)
    arrives as a JSON escape: the frame parser turns it into U+FFFD in every string it hands on, so
    no answer, name, prompt or output can fail to encode in a run record or a tool reply."""
    exec_result = (
        b'{"type":"exec_result","id":3,"stdout":"out \\ud83d","stderr":"\\udc00err","error":"E: \\uD800",'
        b'"answer":{"content":"half \\ud83d an emoji, whole \\ud83d\\ude00","ready":true},'
        b'"variables":["x\\udfff"],"variables_at_start":["\\ud800"],"duration":0.1,"trained_error":"\\ud800"}'
    )
    frame = frames.decode_kernel_frame(exec_result, max_frame_strings(512))[0]
    assert isinstance(frame, ExecResultFrame)
    assert frame.answer == {"content": "half \ufffd an emoji, whole \U0001f600", "ready": True}
    assert (frame.stdout, frame.stderr, frame.error) == ("out \ufffd", "\ufffderr", "E: \ufffd")
    assert frame.variables == ["x\ufffd"] and frame.variables_at_start == ["\ufffd"]
    assert frame.trained_error == "\ufffd"
    request = b'{"type":"lm_request","id":4,"kind":"llm","prompts":["ok","bad \\udc00 one"],"model":"m\\ud800"}'
    parsed = parse_kernel_frame(request)
    assert parsed["prompts"] == ["ok", "bad \ufffd one"] and parsed["model"] == "m\ufffd"
    log = b'{"type":"log","id":null,"message":"\\ud800","extra":{"\\ud800":[["\\udbff"]]}}'
    assert parse_kernel_frame(log) == {
        "type": "log",
        "id": None,
        "message": "\ufffd",
        "extra": {"\ufffd": [["\ufffd"]]},
    }
    for payload in (exec_result, request, log):  # everything the parser hands on encodes as UTF-8
        json.dumps(parse_kernel_frame(payload), ensure_ascii=False).encode("utf-8")
