"""The kernel protocol's typed frames (issue 18 item 1): the host handles dataclasses, the
bytes on the wire are the JSON objects the kernel has always read and written."""

from __future__ import annotations

import json

import pytest

from rlm_mcp.ports.kernel import (
    ContextLoadedFrame,
    ExecFrame,
    ExecResultFrame,
    HostFrame,
    InitFrame,
    InterruptFrame,
    LMRequestFrame,
    LMResultFrame,
    LoadContextFrame,
    LogFrame,
    ReadyFrame,
)
from rlm_mcp.sandbox.frames import FrameDecoder, ProtocolViolation, decode_kernel_frame, encode_frame, max_frame_strings


def wire_json(data: bytes) -> str:
    """The JSON text of one encoded frame (key order included)."""
    (payload,) = FrameDecoder(len(data)).feed(data)
    return payload.decode()


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (
            InitFrame(id=1, output_bytes=100, max_batch=8, answer_max_bytes=50),
            {"type": "init", "id": 1, "output_bytes": 100, "max_batch": 8, "answer_max_bytes": 50},
        ),
        (
            ExecFrame(id=2, code="x = 1", training_cell=True),
            {"type": "exec", "id": 2, "code": "x = 1", "training_cell": True},
        ),
        (InterruptFrame(), {"type": "interrupt", "id": 0}),
        (LMResultFrame(id=3, results=["a", "b"]), {"type": "lm_result", "id": 3, "results": ["a", "b"]}),
        (LMResultFrame(id=4, results=None, error="too many"), {"type": "lm_result", "id": 4, "error": "too many"}),
        (
            LoadContextFrame(index=0, format="text", bytes=12),
            {"type": "load_context", "id": 0, "index": 0, "format": "text", "bytes": 12},
        ),
    ],
)
def test_host_frames_keep_their_wire_format(frame: HostFrame, expected: dict) -> None:
    text = wire_json(encode_frame(frame))
    assert json.loads(text) == expected
    assert list(json.loads(text)) == list(expected)  # the same keys in the same order as before


def decode(obj: dict) -> object:
    payload = json.dumps(obj).encode()
    return decode_kernel_frame(payload, max_frame_strings(16))[0]


def test_kernel_frames_arrive_as_their_dataclasses() -> None:
    result = decode(
        {
            "type": "exec_result",
            "id": 7,
            "stdout": "out",
            "stderr": "",
            "error": None,
            "answer": {"content": "42", "ready": True},
            "variables": ["x"],
            "duration": 1,
            "interrupted": False,  # sent by the kernel, unused by the host: dropped
        }
    )
    assert result == ExecResultFrame(
        id=7,
        stdout="out",
        stderr="",
        error=None,
        answer={"content": "42", "ready": True},
        variables=["x"],
        duration=1.0,
    )
    assert decode({"type": "lm_request", "id": 2, "kind": "rlm", "prompts": ["p"], "model": None}) == LMRequestFrame(
        id=2, kind="rlm", prompts=["p"], model=None, main=False
    )
    assert decode({"type": "log", "id": 0, "message": "m"}) == LogFrame(message="m", id=0)
    assert decode({"type": "context_loaded", "id": 0, "index": 1, "error": None}) == ContextLoadedFrame(index=1, id=0)
    assert decode({"type": "ready", "id": 1, "pid": 7, "python": "3.11.2"}) == ReadyFrame(id=1)
    ready = {"type": "ready", "id": 1, "pid": 7, "python": "3.11.2", "snapshots": True}
    assert decode(ready) == ReadyFrame(id=1, snapshots=True)


def test_a_malformed_frame_never_becomes_a_dataclass() -> None:
    with pytest.raises(ProtocolViolation):
        decode({"type": "lm_request", "id": 2, "kind": "shell", "prompts": ["p"]})
    with pytest.raises(ProtocolViolation):
        decode({"type": "exec_result", "id": 1, "stdout": 5})
