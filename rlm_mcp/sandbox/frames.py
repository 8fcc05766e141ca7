"""Frames on the wire, and the host's checks of every frame the kernel sends.

A frame is a 4-byte big-endian length followed by a UTF-8 JSON object with `type` and `id`.
Everything that comes out of a sandbox is hostile input: sizes are capped before anything is
buffered, each frame is schema-checked before the session acts on it, and every string in it
is made valid text here (a lone UTF-16 surrogate, which a JSON `\\ud83d` escape can carry,
becomes U+FFFD): no answer, name, prompt or output the host keeps can fail to encode later (an
unwritable run record, a tool reply that cannot be sent). The host handles frames as the typed
dataclasses of `rlm_mcp.ports.kernel` (`encode_frame`, `decode_kernel_frame`); the JSON on the
wire is unchanged.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import fields
from typing import Any, get_args

from rlm_mcp.events import SubCallKind
from rlm_mcp.ports.kernel import (
    ContextLoadedFrame,
    ExecResultFrame,
    HostFrame,
    KernelFrame,
    LMRequestFrame,
    LogFrame,
    ReadyFrame,
)
from rlm_mcp.ports.text import LONE_SURROGATE, valid_text

_HEADER = struct.Struct(">I")
KERNEL_FRAME_TYPES = frozenset({"ready", "exec_result", "lm_request", "log", "context_loaded"})
_STRING = re.compile(rb'"[^"]*"')
# A JSON escape of a UTF-16 surrogate (D800-DFFF): only then can the parsed frame hold a lone one
# (strict UTF-8 decoding refuses encoded surrogates; json.loads joins an escaped pair into one
# character). An escaped backslash before "ud800" matches too: that only costs a needless walk.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class ProtocolViolation(Exception):
    """The kernel sent something that is not a well-formed frame of the protocol."""


def encode(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return _HEADER.pack(len(data)) + data


_FIELDS: dict[type, tuple[str, ...]] = {}


def encode_frame(frame: HostFrame) -> bytes:
    """A host frame on the wire: `type`, `id`, then its other fields; a None field is left out."""
    cls = type(frame)
    names = _FIELDS.get(cls)
    if names is None:
        rest = [f.name for f in fields(frame) if f.name not in ("type", "id")]
        names = _FIELDS[cls] = ("id", *rest)  # the order the host always wrote: type, id, the rest
    obj: dict[str, Any] = {"type": frame.type}
    for name in names:
        value = getattr(frame, name)
        if value is not None:
            obj[name] = value
    return encode(obj)


def max_kernel_frame(output_bytes: int, answer_bytes: int) -> int:
    """Largest legal kernel frame: two capped outputs and an answer, JSON-escaped, plus slack."""
    # Control characters escape to 6 bytes each; other text at most doubles (quotes, backslashes).
    return 6 * (2 * output_bytes + answer_bytes) + (1 << 20)


# Frames other than exec_result and lm_request are small: a log frame past 64 KiB is hostile.
# Known from the frame's first bytes, so an oversized one is refused before it is buffered.
SMALL_FRAME_CAPS = {"log": 64 << 10, "ready": 4 << 10, "context_loaded": 64 << 10}
_PEEK_BYTES = 64
_TYPE_PREFIX = re.compile(rb'\{\s*"type"\s*:\s*"([A-Za-z_]{1,32})"')

Reserve = Callable[[int], bool]  # called with a frame's size before its bytes are buffered


class FrameDecoder:
    """Incremental splitter of a byte stream into frame payloads, with per-frame size caps.

    A frame must begin with its `type` (the kernel writes it first). Its first bytes are kept
    in a small head buffer until the type is known, so the type's cap applies before the
    payload's buffer exists: a hostile 60 MB log frame costs 64 bytes, not 60 MB of zeroed
    pages. Then `reserve(size)` is asked before the payload is buffered (it may block, as
    back-pressure). False: not now; `feed` stops there with `waiting` set and `left` naming the
    bytes of its input it did not take (feed them again later: the reserve is asked again).
    Each payload is handed out in the one buffer it was read into, not copied.
    """

    def __init__(self, max_frame: int, reserve: Reserve | None = None) -> None:
        self._max = max_frame
        self._reserve = reserve
        self._header = bytearray()
        self._size: int | None = None  # the current frame's size, once its header is read
        self._head = bytearray()  # its first bytes, until its type is checked
        self._payload: bytearray | None = None
        self._filled = 0
        self.waiting = False  # the last feed stopped at a frame its reserve refused
        self.left = 0  # bytes of the last feed's input not taken

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytearray]:
        out: list[bytearray] = []
        view = memoryview(data)
        self.waiting = False
        while view:
            if self._size is None:
                take = min(4 - len(self._header), len(view))
                self._header += view[:take]
                view = view[take:]
                if len(self._header) < 4:
                    break
                (size,) = _HEADER.unpack(self._header)
                self._header.clear()
                if size > self._max:
                    raise ProtocolViolation(f"a frame of {size} bytes (the cap is {self._max})")
                self._size = size
            size = self._size
            if self._payload is None:
                peek = min(_PEEK_BYTES, size)
                take = min(peek - len(self._head), len(view))
                self._head += view[:take]
                view = view[take:]
                if len(self._head) < peek:
                    break
                self._check_type(self._head, size)
                if self._reserve is not None and not self._reserve(size):
                    self.waiting = True
                    break
                self._payload = bytearray(size)
                self._payload[:peek] = self._head
                self._filled = peek
                self._head.clear()
            payload = self._payload
            take = min(size - self._filled, len(view))
            payload[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == size:
                out.append(payload)
                self._payload, self._size = None, None
        self.left = len(view)
        return out

    @staticmethod
    def _check_type(head: bytes | bytearray, size: int) -> str:
        match = _TYPE_PREFIX.match(head)
        if match is None:
            raise ProtocolViolation("a frame that does not begin with its type")
        kind = match[1].decode("ascii")
        cap = SMALL_FRAME_CAPS.get(kind)
        if cap is not None and size > cap:
            raise ProtocolViolation(f"a {kind} frame of {size} bytes (the cap is {cap})")
        return kind


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _shape(payload: bytes | bytearray, max_strings: int) -> tuple[int, int]:
    """Refuse, before json.loads, a frame made of many small JSON values; return its shape.

    json.loads holds the GIL throughout and turns each `[]`, `"ab"` or `1` into a Python object
    of 30-60 bytes: a 60 MB frame of them cost the host ~1.5 GB and froze its event loop for
    ~13 s. Legitimate frames are a few long strings in a small skeleton (keys, ids, at most
    1000 variable names or max_batch prompts), so count the strings and measure the skeleton,
    in C-speed passes only. Without escaped backslashes and escaped quotes, every remaining
    double quote delimits a string (exact for valid JSON; invalid JSON fails later anyway).
    Returns (strings, skeleton bytes).
    """
    flat = payload.replace(b"\\\\", b"").replace(b'\\"', b"")
    strings = flat.count(b'"') // 2
    if strings > max_strings:
        raise ProtocolViolation(f"a frame of {strings} strings (at most {max_strings})")
    skeleton = len(_STRING.sub(b"", flat))  # at most max_strings matches: a small list inside re
    limit = 4 * max_strings + 1024
    if skeleton > limit:
        raise ProtocolViolation(f"a frame of {skeleton} bytes outside strings (at most {limit})")
    return strings, skeleton


def max_frame_strings(max_batch: int) -> int:
    """Strings a legitimate kernel frame may hold: keys, <= 1000 variable names, a batch of prompts."""
    return 2048 + max_batch


def parse_kernel_frame_sized(payload: bytes | bytearray, max_strings: int) -> tuple[dict[str, Any], int]:
    """Decode and schema-check one kernel frame (ProtocolViolation on anything off); return it with
    a bound on the host memory the parsed frame holds.

    The bound (4 bytes per payload byte for UCS-4 strings, plus ~64 bytes per JSON value) is
    what the reader charges against its inbox budget, so queued frames cannot amplify.
    """
    strings, skeleton = _shape(payload, max_strings)
    cost = 4 * len(payload) + 64 * (strings + skeleton)
    try:
        obj = json.loads(payload.decode("utf-8"))
    except RecursionError:
        raise ProtocolViolation("a frame nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolViolation(f"a frame that is not UTF-8 JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise ProtocolViolation("a frame that is not a JSON object")
    if _SURROGATE_ESCAPE.search(payload) is not None:
        obj = mend_text(obj)
    kind = obj.get("type")
    if kind not in KERNEL_FRAME_TYPES:
        raise ProtocolViolation(f"an unknown frame type {str(kind)[:40]!r}")
    announced = _TYPE_PREFIX.match(payload[:_PEEK_BYTES])
    if announced is None or announced[1] != kind.encode():  # a second "type" key overrode the first
        raise ProtocolViolation("a frame whose type is not the one it begins with")
    fid = obj.get("id")
    if not (fid is None or (isinstance(fid, int) and not isinstance(fid, bool))):
        raise ProtocolViolation(f"a {kind} frame with a bad id")
    check = _CHECKS[kind]
    problem = check(obj)
    if problem:
        raise ProtocolViolation(f"a malformed {kind} frame ({problem})")
    return obj, cost


def mend_text(obj: dict[str, Any]) -> dict[str, Any]:
    """A parsed frame with `valid_text` applied to every string in it, keys included.

    Walked with an explicit stack, not recursion: how deep a frame nests is the sandbox's choice.
    Lists and dicts are mended in place (they are the frame's own, fresh from json.loads)."""
    root = _mended_dict(obj)
    stack: list[dict[str, Any] | list[Any]] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                node[key] = _mended(value, stack)
        else:
            for index, value in enumerate(node):
                node[index] = _mended(value, stack)
    return root


def _mended(value: Any, stack: list[dict[str, Any] | list[Any]]) -> Any:
    """A string mended, a container pushed to be walked (a dict first gets valid keys)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        value = _mended_dict(value)
        stack.append(value)
    elif isinstance(value, list):
        stack.append(value)
    return value


def _mended_dict(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` itself, or a copy whose keys are valid text when one of them was not."""
    if all(LONE_SURROGATE.search(key) is None for key in obj):
        return obj
    return {valid_text(key): value for key, value in obj.items()}


def decode_kernel_frame(payload: bytes | bytearray, max_strings: int) -> tuple[KernelFrame, int]:
    """`parse_kernel_frame_sized`, as the typed frame (fields the host does not use are dropped)."""
    obj, cost = parse_kernel_frame_sized(payload, max_strings)
    return kernel_frame(obj), cost


def kernel_frame(obj: dict[str, Any]) -> KernelFrame:
    """A checked kernel frame (`parse_kernel_frame_sized`) as its dataclass."""
    kind = obj["type"]
    fid = obj.get("id")
    if kind == "exec_result":
        return ExecResultFrame(
            id=obj["id"],
            stdout=obj["stdout"],
            stderr=obj["stderr"],
            error=obj.get("error"),
            answer=obj.get("answer"),
            variables=obj["variables"],
            duration=float(obj["duration"]),
            trained_error=obj.get("trained_error"),
            variables_at_start=obj.get("variables_at_start"),
        )
    if kind == "lm_request":
        return LMRequestFrame(
            id=obj["id"], kind=obj["kind"], prompts=obj["prompts"], model=obj.get("model"), main=obj.get("main") is True
        )
    if kind == "log":
        return LogFrame(message=obj["message"], id=fid)
    if kind == "context_loaded":
        return ContextLoadedFrame(index=obj["index"], error=obj.get("error"), id=fid)
    error = obj.get("channel_error")
    return ReadyFrame(
        id=fid,
        snapshots=obj.get("snapshots") is True,
        channel="socket" if obj.get("channel") == "socket" else "attach",
        channel_error=error[:300] if isinstance(error, str) else None,
    )


def _check_exec_result(obj: dict[str, Any]) -> str | None:
    if not isinstance(obj.get("id"), int):
        return "no id"
    for key in ("stdout", "stderr"):
        if not isinstance(obj.get(key), str):
            return f"{key} is not a string"
    if obj.get("error") is not None and not isinstance(obj["error"], str):
        return "error is not a string"
    answer = obj.get("answer")
    if answer is not None:
        if not isinstance(answer, dict) or set(answer) != {"content", "ready"}:
            return "answer is not {content, ready}"
        if answer["content"] is not None and not isinstance(answer["content"], str):
            return "answer content is not a string"
        if not isinstance(answer["ready"], bool):
            return "answer ready is not a bool"
    if not _is_str_list(obj.get("variables")) or len(obj["variables"]) > 1000:
        return "variables is not a list of strings"
    if obj.get("trained_error") is not None and not isinstance(obj["trained_error"], str):
        return "trained_error is not a string"
    at_start = obj.get("variables_at_start")
    if at_start is not None and (not _is_str_list(at_start) or len(at_start) > 1000):
        return "variables_at_start is not a list of strings"
    if not isinstance(obj.get("duration"), (int, float)):
        return "duration is not a number"
    return None


def _check_lm_request(obj: dict[str, Any]) -> str | None:
    if not isinstance(obj.get("id"), int):
        return "no id"
    if obj.get("kind") not in get_args(SubCallKind):
        return "kind is not llm|rlm"
    if not _is_str_list(obj.get("prompts")):
        return "prompts is not a list of strings"
    if obj.get("model") is not None and not isinstance(obj["model"], str):
        return "model is not a string"
    if obj.get("main") is not None and not isinstance(obj["main"], bool):
        return "main is not a bool"
    return None


def _check_ready(obj: dict[str, Any]) -> str | None:
    if obj.get("channel") not in (None, "attach", "socket"):
        return "channel is not attach or socket"
    if obj.get("channel_error") is not None and not isinstance(obj["channel_error"], str):
        return "channel_error is not a string"
    return None


def _check_log(obj: dict[str, Any]) -> str | None:
    return None if isinstance(obj.get("message"), str) else "message is not a string"


def _check_loaded(obj: dict[str, Any]) -> str | None:
    if not isinstance(obj.get("index"), int):
        return "index is not an int"
    if obj.get("error") is not None and not isinstance(obj["error"], str):
        return "error is not a string"
    return None


_CHECKS = {
    "exec_result": _check_exec_result,
    "lm_request": _check_lm_request,
    "ready": _check_ready,
    "log": _check_log,
    "context_loaded": _check_loaded,
}
