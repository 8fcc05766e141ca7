"""A kept session's namespace as an opaque blob: taken and restored INSIDE the sandbox.

When a session's sandbox is to be given back, the sandbox serializes its own namespace with dill (Debian's
`python3-dill` in the sandbox image); the host receives the result as base64 text through
ordinary cells' output, in chunks under the cell-output cap, and keeps the decoded bytes without
ever deserializing them (nothing here imports pickle or dill). A restore sends the blob back the
same way (as string literals in cells) into a fresh sandbox, where it is loaded.

What is saved: every name the model can see except the helpers, `answer` (reset for each run)
and the contexts (`context`, `context_i`: a restore reloads them by id, so they are never copied
into the blob). Each value is serialized on its own: one that cannot be (a thread, an open
socket, a generator) is left out and named, never fails the snapshot. A module bound to a name
is saved by its name and imported again. A name bound to the same object as an earlier one
(`history` and `history_0`) is saved as that alias, so it is the same object after a restore.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass

from rlm_mcp.config import Settings
from rlm_mcp.observability import metrics
from rlm_mcp.ports import CellResult, LMRequest, Sandbox

# Names prefixed `_rlm_` are the host's scratch; `_`-names are never listed to the model.
_TAKE = """\
def _rlm_take(limit):
    import base64, pickle, re, types
    try:
        import dill
    except ImportError:
        return "NO-DILL"
    skip = {"llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched", "SHOW_VARS", "FINAL",
            "FINAL_VAR", "answer", "__builtins__", "__name__"}
    parts, lost, seen = {}, [], {}
    for name, value in list(globals().items()):
        if type(name) is not str or name.startswith("_") or name in skip or re.fullmatch(r"context(_[0-9]+)?", name):
            continue
        if id(value) in seen:
            parts[name] = ("alias", seen[id(value)])
            continue
        seen[id(value)] = name
        if isinstance(value, types.ModuleType):
            parts[name] = ("module", value.__name__)
            continue
        try:
            parts[name] = ("dill", dill.dumps(value, recurse=True))
        except BaseException:
            lost.append(name)
    blob = base64.b64encode(pickle.dumps((parts, lost), protocol=4)).decode("ascii")
    if len(blob) > limit:
        return "TOO-BIG %d" % len(blob)
    return blob
_rlm_snap = _rlm_take(LIMIT)
del _rlm_take
print(len(_rlm_snap), end="")
"""

_RESTORE = """\
def _rlm_restore(text):
    import base64, importlib, pickle
    import dill
    parts, lost = pickle.loads(base64.b64decode(text))
    for name, (kind, data) in parts.items():
        if kind == "alias":
            continue
        try:
            globals()[name] = importlib.import_module(data) if kind == "module" else dill.loads(data)
        except BaseException:
            lost.append(name)
    for name, (kind, data) in parts.items():
        if kind == "alias":
            if data in globals() and data not in lost:
                globals()[name] = globals()[data]
            else:
                lost.append(name)
    return lost
_rlm_lost = _rlm_restore("".join(_rlm_in))
del _rlm_restore, _rlm_in
print(",".join(_rlm_lost), end="")
del _rlm_lost
"""


def snapshot_chunk(settings: Settings) -> int:
    """Characters per cell when a snapshot crosses (under the cell-output cap, with room)."""
    return max(settings.cell_output_bytes // 2, 4096)


class SnapshotUnavailable(Exception):
    """The sandbox could not make a snapshot; `str()` says why (no dill in the image, too big)."""


class ReplRestarted(SnapshotUnavailable):
    """The REPL had stopped (a cancelled cell, a crash) and came back empty: there is nothing to
    save, and the caller must not take the live REPL for the session's namespace any more."""


@dataclass(frozen=True)
class Snapshot:
    """The blob, never deserialized on the host (the names left out are inside it)."""

    blob: bytes


async def _quiet_bridge(request: LMRequest) -> list[str]:
    return ["Error: no sub-calls here."] * len(request.prompts)


async def _cell(sandbox: Sandbox, code: str) -> CellResult:
    result = await sandbox.execute(code, _quiet_bridge)
    if result.restarted:
        raise ReplRestarted("the REPL had stopped since the run and was started again, empty")
    if result.error:
        raise SnapshotUnavailable(f"the snapshot cell failed: {(result.error or result.notice or '')[:300]}")
    return result


async def take_snapshot(sandbox: Sandbox, *, max_bytes: int, chunk_chars: int) -> Snapshot:
    """Serialize the sandbox's namespace inside it; the blob back, in chunks of `chunk_chars`."""
    started = time.monotonic()
    limit = (max_bytes * 4) // 3 + 4  # base64 of max_bytes
    first = await _cell(sandbox, _TAKE.replace("LIMIT", str(limit)))
    try:
        size = int(first.stdout)
    except ValueError:
        await sandbox.execute("_rlm_snap = None\ndel _rlm_snap", _quiet_bridge)
        raise SnapshotUnavailable(f"the snapshot cell said {first.stdout[:200]!r}") from None
    try:
        head = (await _cell(sandbox, "print(_rlm_snap[:16], end='')")).stdout
        if head == "NO-DILL":
            raise SnapshotUnavailable(
                "the sandbox image has no dill (python3-dill): rebuild it with `rlm-mcp image build` (both build paths install it)"
            )
        if head.startswith("TOO-BIG"):
            raise SnapshotUnavailable(f"the namespace is larger than RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES ({head})")
        pieces = []
        for start in range(0, size, chunk_chars):
            piece = await _cell(sandbox, f"print(_rlm_snap[{start}:{start + chunk_chars}], end='')")
            pieces.append(piece.stdout)
    finally:
        await sandbox.execute("_rlm_snap = None\ndel _rlm_snap", _quiet_bridge)
    text = "".join(pieces)
    if len(text) != size:
        raise SnapshotUnavailable(f"the snapshot came back cut ({len(text)} of {size} characters)")
    try:
        blob = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SnapshotUnavailable(f"the snapshot is not base64 ({exc})") from None
    metrics.session_snapshot(len(blob), time.monotonic() - started)
    return Snapshot(blob=blob)


async def restore_snapshot(sandbox: Sandbox, snapshot: Snapshot, *, chunk_chars: int) -> list[str]:
    """Load `snapshot` into a fresh sandbox (inside it); the names that could not be restored
    (left out when it was taken, or failing to load now)."""
    text = base64.b64encode(snapshot.blob).decode("ascii")
    await _cell(sandbox, "_rlm_in = []")
    for start in range(0, len(text), chunk_chars):
        await _cell(sandbox, f"_rlm_in.append({text[start : start + chunk_chars]!r})")
    result = await _cell(sandbox, _RESTORE)
    return [name for name in result.stdout.split(",") if name]
