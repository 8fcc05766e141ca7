"""Property-based fuzz of the host's frame decoder and kernel-frame checks (issue 14 item 12):
whatever bytes a sandbox writes, the host gets whole frames back, or a ProtocolViolation, never
another exception and never a frame over the cap."""

from __future__ import annotations

import json
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlm_mcp.sandbox.frames import (
    KERNEL_FRAME_TYPES,
    FrameDecoder,
    ProtocolViolation,
    encode,
    max_frame_strings,
    parse_kernel_frame_sized,
)


def parse_kernel_frame(payload: bytes | bytearray) -> dict[str, object]:
    frame, _ = parse_kernel_frame_sized(payload, max_frame_strings(512))
    return frame


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CAP = 4096

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for point in [*points, len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


# The decoder refuses a frame that does not begin with its type (the kernel writes it first);
# what follows the type is the parser's business, so any bytes may follow here.
TYPED = b'{"type": "exec_result", '
typed_payloads = st.binary(max_size=CAP - len(TYPED)).map(lambda body: TYPED + body)


@FUZZ
@given(st.lists(typed_payloads, max_size=8), st.lists(st.integers(min_value=0), max_size=12))
def test_frames_split_anywhere_come_back_whole_and_in_order(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(struct.pack(">I", len(p)) + p for p in payloads)
    decoder = FrameDecoder(CAP)
    out: list[bytes | bytearray] = []
    for piece in split(stream, cuts):
        out += decoder.feed(piece)
    assert out == payloads


@FUZZ
@given(st.binary(min_size=1, max_size=CAP), st.lists(st.integers(min_value=0), max_size=4))
def test_a_frame_without_its_type_first_is_a_protocol_violation(body: bytes, cuts: list[int]) -> None:
    if body.lstrip().startswith(b"{"):
        body = b"[" + body  # never a JSON object that could begin with its type
    decoder = FrameDecoder(CAP)
    stream = struct.pack(">I", len(body)) + body
    try:
        for piece in split(stream, cuts):
            decoder.feed(piece)
    except ProtocolViolation:
        return
    raise AssertionError("an untyped frame was accepted")


@FUZZ
@given(typed_payloads, st.integers(min_value=CAP + 1, max_value=2**32 - 1), st.binary(max_size=64))
def test_an_oversized_header_is_refused_before_its_body(prefix_body: bytes, size: int, tail: bytes) -> None:
    decoder = FrameDecoder(CAP)
    assert decoder.feed(struct.pack(">I", len(prefix_body)) + prefix_body) == [prefix_body]
    try:
        decoder.feed(struct.pack(">I", size) + tail)
    except ProtocolViolation as exc:
        assert str(size) in str(exc)
    else:
        raise AssertionError("an oversized frame was accepted")


def _parse_or_violation(payload: bytes) -> None:
    try:
        frame = parse_kernel_frame(payload)
    except ProtocolViolation:
        return
    assert isinstance(frame, dict) and frame["type"] in KERNEL_FRAME_TYPES


@FUZZ
@given(st.binary(max_size=2048))
def test_any_bytes_parse_or_are_a_protocol_violation(payload: bytes) -> None:
    _parse_or_violation(payload)


@FUZZ
@given(
    st.sampled_from(sorted(KERNEL_FRAME_TYPES) + ["exec", "bogus"]),
    st.dictionaries(
        st.sampled_from(
            [
                "id",
                "stdout",
                "stderr",
                "error",
                "answer",
                "variables",
                "duration",
                "kind",
                "prompts",
                "model",
                "message",
                "index",
                "extra",
            ]
        ),
        json_values,
        max_size=8,
    ),
)
def test_any_json_object_of_any_type_parses_or_is_a_protocol_violation(kind: str, fields: dict) -> None:
    _parse_or_violation(json.dumps({**fields, "type": kind}).encode())


@FUZZ
@given(
    st.integers(min_value=1, max_value=1000),
    st.text(max_size=200),
    st.text(max_size=200),
    st.lists(st.text(max_size=20), max_size=20),
    st.none() | st.text(max_size=50),
    st.booleans(),
)
def test_well_formed_exec_results_round_trip(
    fid: int, stdout: str, stderr: str, variables: list[str], content: str | None, ready: bool
) -> None:
    frame = {
        "type": "exec_result",
        "id": fid,
        "stdout": stdout,
        "stderr": stderr,
        "error": None,
        "answer": {"content": content, "ready": ready},
        "variables": variables,
        "duration": 0.5,
    }
    wire = encode(frame)
    (payload,) = FrameDecoder(len(wire)).feed(wire)
    assert parse_kernel_frame(payload) == frame


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=60))
def test_deep_nesting_is_a_protocol_violation(depth_k: int) -> None:
    payload = b'{"type": "log", "message": "m", "x": ' + b"[" * (depth_k * 1000) + b"]" * (depth_k * 1000) + b"}"
    _parse_or_violation(payload)
