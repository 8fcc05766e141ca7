"""A kept session's namespace as an opaque blob: taken and restored INSIDE the sandbox.

When a session's sandbox is to be given back, the sandbox serializes its own namespace with dill (Debian's
`python3-dill` in the sandbox image); the host receives the result as base64 text through
ordinary cells' output, in chunks under the cell-output cap, and writes the decoded bytes to a
private file as they come, without ever deserializing them (nothing here imports pickle or dill).
A restore reads that file back in pieces and sends each (as a string literal in a cell) into a
fresh sandbox, where the whole is loaded.

Whatever the sandbox prints is hostile input: the cells that made the snapshot run beside the
session's own code, which may have replaced anything they use. So the host bounds the transfer
itself, before it reads (the claimed size against RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES) and while
it reads (each piece must be exactly the length asked for, so the running total never passes
the claim), holds one piece at a time, and gives up at a deadline that no piece extends
(`snapshot_deadline_s`): a cell that never answers, or answers slowly, cannot hold the
sandbox, its slot or the caller past it. After a deadline the sandbox's state is unknown and the
caller must let it go (`SnapshotTimedOut`).

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
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from rlm_mcp.errors import SandboxError
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


_SIZE = re.compile(r"[0-9]{1,20}")
_PRIVATE = 0o600


def snapshot_chunk(cell_output_bytes: int) -> int:
    """Characters per cell when a snapshot crosses (under the cell-output cap,
    RLM_MCP_CELL_OUTPUT_BYTES, with room)."""
    return max(cell_output_bytes // 2, 4096)


def snapshot_deadline_s(cell_timeout_s: float, snapshot_wait_s: float) -> float:
    """How long one snapshot may take, from its first cell to its last piece on this host.

    Derived from two existing settings, no setting of its own: the cell that serializes the
    namespace may run as long as any cell (RLM_MCP_CELL_TIMEOUT_S), and bringing the result out
    may take as long as a follow-up waits for a snapshot (RLM_MCP_SESSION_SNAPSHOT_WAIT_S); a
    snapshot slower than both is of no use to the session and holds a sandbox slot meanwhile."""
    return cell_timeout_s + snapshot_wait_s


class SnapshotUnavailable(Exception):
    """The sandbox could not make a snapshot; `str()` says why (no dill in the image, too big)."""


class ReplRestarted(SnapshotUnavailable):
    """The REPL had stopped (a cancelled cell, a crash) and came back empty: there is nothing to
    save, and the caller must not take the live REPL for the session's namespace any more."""


class SnapshotTimedOut(SnapshotUnavailable):
    """The snapshot ran past its deadline: the cell under way was abandoned (its sandbox killed or
    in an unknown state), so the caller must let the sandbox go."""


@dataclass(frozen=True)
class Snapshot:
    """A snapshot at rest on this host: a private file of `size` bytes, never deserialized here
    (the names left out are inside it)."""

    path: Path
    size: int

    def discard(self) -> None:
        """Remove its file (a snapshot nobody will restore)."""
        self.path.unlink(missing_ok=True)


async def _quiet_bridge(request: LMRequest) -> list[str]:
    return ["Error: no sub-calls here."] * len(request.prompts)


async def _cell(sandbox: Sandbox, code: str) -> CellResult:
    result = await sandbox.execute(code, _quiet_bridge)
    if result.restarted:
        raise ReplRestarted("the REPL had stopped since the run and was started again, empty")
    if result.error:
        raise SnapshotUnavailable(f"the snapshot cell failed: {(result.error or result.notice or '')[:300]}")
    return result


def _base64_chars(size: int) -> int:
    return 4 * ((size + 2) // 3)


def _open_private(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _PRIVATE)


async def take_snapshot(
    sandbox: Sandbox, path: Path, *, max_bytes: int, chunk_chars: int, deadline_s: float
) -> Snapshot:
    """Serialize the sandbox's namespace inside it and write it to `path` (a private file,
    replaced), a piece of at most `chunk_chars` characters at a time; within `deadline_s`.
    `SnapshotUnavailable` says why there is none (the file may then hold a part: the caller
    removes it)."""
    started = time.monotonic()
    limit = _base64_chars(max_bytes)
    chunk = max(4, chunk_chars - chunk_chars % 4)  # whole base64 quads: each piece decodes alone
    try:
        with anyio.fail_after(deadline_s):
            size = await _claimed_size(sandbox, limit)
            try:
                written = await _bring_out(sandbox, path, size, chunk)
            except SnapshotUnavailable:
                await _forget(sandbox)
                raise
            await _forget(sandbox)
    except TimeoutError:
        raise SnapshotTimedOut(
            f"the snapshot did not finish within {deadline_s:g} s (RLM_MCP_CELL_TIMEOUT_S + "
            "RLM_MCP_SESSION_SNAPSHOT_WAIT_S), so its sandbox was let go"
        ) from None
    metrics.session_snapshot(written, time.monotonic() - started)
    return Snapshot(path=path, size=written)


async def _claimed_size(sandbox: Sandbox, limit: int) -> int:
    """Run the serializing cell; the size it claims, refused past `limit` before anything is read."""
    first = await _cell(sandbox, _TAKE.replace("LIMIT", str(limit)))
    claim = first.stdout
    if not _SIZE.fullmatch(claim):
        await _forget(sandbox)
        raise SnapshotUnavailable(f"the snapshot cell said {claim[:200]!r}")
    size = int(claim)
    if size > limit:  # the sandbox's own check was bypassed: the host's holds
        await _forget(sandbox)
        raise SnapshotUnavailable(
            f"the sandbox claims a snapshot of {size} characters, more than "
            f"RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES allows ({limit} characters of base64)"
        )
    return size


async def _bring_out(sandbox: Sandbox, path: Path, size: int, chunk: int) -> int:
    """Read the claimed `size` characters in pieces, decode each and append it to `path`; the
    bytes written. A piece of any other length than asked ends it: the total never passes `size`."""
    written = 0
    async with await anyio.open_file(path, "wb", opener=lambda p, _flags: _open_private(Path(p))) as out:
        for start in range(0, size, chunk):
            want = min(chunk, size - start)
            text = (await _cell(sandbox, f"print(_rlm_snap[{start}:{start + want}], end='')")).stdout
            if start == 0:
                _check_marker(text)
            if len(text) != want:
                raise SnapshotUnavailable(
                    f"the snapshot came back cut or padded ({len(text)} characters where {want} were asked for, "
                    f"at {start} of {size})"
                )
            try:
                piece = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise SnapshotUnavailable(f"the snapshot is not base64 ({exc})") from None
            await out.write(piece)
            written += len(piece)
    return written


def _check_marker(head: str) -> None:
    """The serializing cell's own refusals, stored where the snapshot would be."""
    if head.startswith("NO-DILL"):
        raise SnapshotUnavailable(
            "the sandbox image has no dill (python3-dill): rebuild it with `rlm-mcp image build` (both build paths install it)"
        )
    if head.startswith("TOO-BIG"):
        raise SnapshotUnavailable(f"the namespace is larger than RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES ({head[:40]})")


async def _forget(sandbox: Sandbox) -> None:
    """Drop the serialized copy inside the sandbox (its result does not matter)."""
    await sandbox.execute("_rlm_snap = None\ndel _rlm_snap", _quiet_bridge)


async def restore_snapshot(sandbox: Sandbox, snapshot: Snapshot, *, chunk_chars: int) -> list[str]:
    """Load `snapshot` into a fresh sandbox (inside it); the names that could not be restored
    (left out when it was taken, or failing to load now). Reads its file a piece at a time."""
    step = max(3, (max(4, chunk_chars) // 4) * 3)  # bytes whose base64 fills at most a chunk
    try:
        await _cell(sandbox, "_rlm_in = []")
        async with await anyio.open_file(snapshot.path, "rb") as source:
            while piece := await source.read(step):
                text = base64.b64encode(piece).decode("ascii")
                await _cell(sandbox, f"_rlm_in.append({text!r})")
        result = await _cell(sandbox, _RESTORE)
    except ReplRestarted:
        raise SnapshotUnavailable(
            "the fresh sandbox stopped while the namespace was loaded into it (it may not fit in "
            "RLM_MCP_SANDBOX_MEMORY)"
        ) from None
    except OSError as exc:
        raise SnapshotUnavailable(f"its snapshot could not be read on this host ({exc})") from None
    return [name for name in result.stdout.split(",") if name]


def restore_failed(session_id: str, exc: SnapshotUnavailable) -> SandboxError:
    """The tool error of a follow-up whose restore failed inside the fresh sandbox: that sandbox
    is not kept, the snapshot is (a later follow-up tries again)."""
    return SandboxError(
        f"Session {session_id} could not be restored in a fresh sandbox: {exc}. Nothing ran; the fresh sandbox "
        "was let go and the session keeps its snapshot.",
        "Ask again to retry the restore (after fixing the cause, e.g. an image without python3-dill: "
        "`rlm-mcp image build`), or close the session with rlm_close_session and start a new one.",
    )
