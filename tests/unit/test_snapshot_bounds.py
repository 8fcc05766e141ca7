"""The host bounds a snapshot whatever the sandbox says (engine/snapshot.py): its claimed size is
checked against RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES before anything is read, every piece must be
exactly the length asked for, at most one piece is in memory (each goes to the file as it comes),
and a snapshot that does not end stops at its deadline. The sandbox here is a hostile script:
a cell that replaced what the in-sandbox check uses can answer anything."""

from __future__ import annotations

import base64
import re
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import pytest

from rlm_mcp.engine.snapshot import (
    SnapshotTimedOut,
    SnapshotUnavailable,
    restore_snapshot,
    take_snapshot,
)
from rlm_mcp.ports import CellResult, ContextSpec, LMBridge

pytestmark = pytest.mark.anyio

_SLICE = re.compile(r"print\(_rlm_snap\[(\d+):(\d+)\], end=''\)")


class HostileSandbox:
    """Answers the snapshot's cells from `serve(start, stop)`, claiming `claim` characters."""

    def __init__(self, claim: str, serve: Callable[[int, int], str], *, delay_s: float = 0.0) -> None:
        self.claim = claim
        self.serve = serve
        self.delay_s = delay_s
        self.cells: list[str] = []

    async def execute(self, code: str, bridge: LMBridge, *, training_cell: bool = False) -> CellResult:
        self.cells.append(code)
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        if "_rlm_take(" in code:
            return CellResult(stdout=self.claim)
        sliced = _SLICE.fullmatch(code)
        if sliced:
            return CellResult(stdout=self.serve(int(sliced[1]), int(sliced[2])))
        return CellResult()

    async def add_contexts(self, contexts: Sequence[ContextSpec]) -> None:
        return None

    @property
    def pieces_asked(self) -> int:
        return sum(1 for code in self.cells if _SLICE.fullmatch(code))


def _honest(text: str) -> Callable[[int, int], str]:
    return lambda start, stop: text[start:stop]


async def test_a_claim_past_the_limit_is_refused_before_a_piece_is_read(tmp_path: Path) -> None:
    # The in-sandbox check said nothing (its `len` was replaced): the claim is 48 MiB of base64.
    text = base64.b64encode(b"z" * (1 << 20)).decode()
    box = HostileSandbox(str(48 << 20), _honest(text))
    with pytest.raises(SnapshotUnavailable, match="claims a snapshot of 50331648 characters.*SNAPSHOT_MAX_BYTES"):
        await take_snapshot(box, tmp_path / "s", max_bytes=1 << 20, chunk_chars=4096, deadline_s=60)
    assert box.pieces_asked == 0
    # A claim of 10**15 (a number Python's int() would take) is refused the same way.
    box = HostileSandbox(str(10**15), _honest(text))
    with pytest.raises(SnapshotUnavailable, match="claims a snapshot"):
        await take_snapshot(box, tmp_path / "s", max_bytes=1 << 20, chunk_chars=4096, deadline_s=60)
    assert box.pieces_asked == 0


@pytest.mark.parametrize("make", [lambda t: t * 5, lambda t: "", lambda t: t[:-4]])
async def test_a_piece_of_any_other_length_than_asked_ends_the_snapshot_at_once(
    tmp_path: Path, make: Callable[[str], str]
) -> None:
    text = base64.b64encode(b"q" * 30000).decode()  # claimed honestly, within the limit
    box = HostileSandbox(str(len(text)), lambda start, stop: make(text[start:stop]))
    with pytest.raises(SnapshotUnavailable, match="came back cut or padded"):
        await take_snapshot(box, tmp_path / "s", max_bytes=1 << 20, chunk_chars=4096, deadline_s=60)
    assert box.pieces_asked == 1


async def test_one_piece_at_a_time_is_held_while_the_snapshot_goes_to_its_file(tmp_path: Path) -> None:
    blob = bytes(range(256)) * (32 << 10)  # 8 MiB
    text = base64.b64encode(blob).decode()
    box = HostileSandbox(str(len(text)), _honest(text))
    chunk = 64 << 10
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        snapshot = await take_snapshot(box, tmp_path / "s", max_bytes=16 << 20, chunk_chars=chunk, deadline_s=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert snapshot.size == len(blob) and snapshot.path.read_bytes() == blob
    assert snapshot.path.stat().st_mode & 0o077 == 0
    # A piece, its decoded bytes and the file's buffer: far below the 8 MiB (and the 11 MiB of
    # base64) the host used to join and decode whole.
    assert peak < 16 * chunk, peak

    # The restore reads the file back a piece at a time too, each piece a whole base64 text.
    fresh = HostileSandbox("", _honest(""))
    await restore_snapshot(fresh, snapshot, chunk_chars=chunk)
    sent = [c for c in fresh.cells if c.startswith("_rlm_in.append(")]
    assert all(len(c) <= chunk + 32 for c in sent)
    assert b"".join(base64.b64decode(c[len("_rlm_in.append('") : -2]) for c in sent) == blob


async def test_a_snapshot_that_does_not_end_stops_at_its_deadline(tmp_path: Path) -> None:
    text = base64.b64encode(b"w" * 400000).decode()
    # Honest pieces, each after a pause: the whole would take minutes.
    box = HostileSandbox(str(len(text)), _honest(text), delay_s=0.5)
    with pytest.raises(SnapshotTimedOut, match="did not finish within 2 s"):
        await take_snapshot(box, tmp_path / "s", max_bytes=1 << 20, chunk_chars=4096, deadline_s=2)
    assert box.pieces_asked < len(text) // 4096
