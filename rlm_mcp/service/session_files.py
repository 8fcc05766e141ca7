"""Kept sessions at rest: a released session's record and snapshot in the data dir.

When a server stops (or a one-off `rlm-mcp run --keep-session` ends), each session it holds is
snapshotted (inside its sandbox) and written here: `sessions/<id>.json` (owner, runs, the
context ids in binding order, the stored conversations) and `sessions/<id>.snap` (the opaque
snapshot, never deserialized on the host), both 0600 in a 0700 folder. Any later process on the
same data dir takes a session back on its next follow-up: it claims the record by renaming it
(atomic: of two processes, one wins), then restores the snapshot in a fresh sandbox.

`rlm-mcp sessions close` removes both and leaves `sessions/<id>.closed` (the owner, a few bytes),
so that a later follow-up says the session "was closed", as a server says for one closed over
MCP, rather than calling it unknown; the marker goes with the session's maximum age.

The `.snap` file is where a snapshot goes as it is taken, a piece at a time (engine/snapshot.py
never holds a whole one in memory): a live session's snapshot is that file from its first
release on, and only its record is written when the server stops. Without its record, a `.snap`
is this process's alone (no other process claims it). A team worker spools a snapshot to a file
here on its way to or from the database (`spool_path`). Files older than the sessions' maximum
age are a crashed process's leftovers (`drop_older_than`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm_mcp.store.private import PRIVATE_FILE, private_dir

_ID = re.compile(r"^ses_[0-9a-f]{20}$")


@dataclass
class StoredSession:
    """What a stopped session left: enough to continue it in another process."""

    session_id: str
    owner: str
    created_at: float
    run_ids: list[str]
    bound_context_ids: list[str]  # context_0, context_1, ... in order
    histories: list[list[dict[str, str]]]
    snapshot_bytes: int  # its snapshot is the file at `snapshot_path`


def _folder(data_dir: Path) -> Path:
    return data_dir / "sessions"


def _write(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + f".tmp{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temp, path)


def snapshot_path(data_dir: Path, session_id: str) -> Path:
    """Where the session's snapshot lives (its folder made, private; blocking)."""
    if not _ID.match(session_id):
        raise ValueError(f"not a session id: {session_id!r}")
    folder = _folder(data_dir)
    private_dir(folder)
    return folder / f"{session_id}.snap"


def taking_path(data_dir: Path, session_id: str) -> Path:
    """Where a new snapshot of the session is written while it is taken (`commit` moves it to
    `snapshot_path` once whole; blocking)."""
    return snapshot_path(data_dir, session_id).with_name(f"{session_id}.snap.tmp{os.getpid()}")


def commit(taken: Path, data_dir: Path, session_id: str) -> Path:
    """A whole snapshot becomes the session's (replacing the one before); its path."""
    final = snapshot_path(data_dir, session_id)
    os.replace(taken, final)
    return final


def spool_path(data_dir: Path, session_id: str) -> Path:
    """A private file of its own for a team worker's snapshot on its way to or from the database."""
    return snapshot_path(data_dir, session_id).with_name(f"{session_id}.{secrets.token_hex(6)}.spool")


def save(data_dir: Path, stored: StoredSession) -> None:
    """Write a session's record beside its snapshot (blocking: call it in a worker thread)."""
    folder = _folder(data_dir)
    private_dir(folder)
    if not (folder / f"{stored.session_id}.snap").is_file():
        raise FileNotFoundError(f"session {stored.session_id} has no snapshot file")
    record: dict[str, Any] = {
        "session_id": stored.session_id,
        "owner": stored.owner,
        "created_at": stored.created_at,
        "run_ids": stored.run_ids,
        "bound_context_ids": stored.bound_context_ids,
        "histories": stored.histories,
    }
    _write(folder / f"{stored.session_id}.json", json.dumps(record).encode("utf-8"))


def owner_of(data_dir: Path, session_id: str) -> str | None:
    """The owner of a stored session, or None when there is none."""
    if not _ID.match(session_id):
        return None
    try:
        record = json.loads((_folder(data_dir) / f"{session_id}.json").read_text(encoding="utf-8"))
        return str(record["owner"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def claim(data_dir: Path, session_id: str) -> StoredSession | None:
    """Take a stored session (None when there is none, or another process took it first); its
    record is removed: from now on it lives in this process, its snapshot the file at
    `snapshot_path` (read a piece at a time by the restore)."""
    if not _ID.match(session_id):
        return None
    folder = _folder(data_dir)
    record_path, snap_path = folder / f"{session_id}.json", folder / f"{session_id}.snap"
    taken = folder / f"{session_id}.json.taken{os.getpid()}"
    try:
        os.rename(record_path, taken)
    except OSError:
        return None
    try:
        record = json.loads(taken.read_text(encoding="utf-8"))
        size = snap_path.stat().st_size
    except (OSError, ValueError):
        snap_path.unlink(missing_ok=True)
        return None
    finally:
        taken.unlink(missing_ok=True)
    return StoredSession(
        session_id=session_id,
        owner=str(record["owner"]),
        created_at=float(record["created_at"]),
        run_ids=[str(r) for r in record["run_ids"]],
        bound_context_ids=[str(c) for c in record["bound_context_ids"]],
        histories=list(record["histories"]),
        snapshot_bytes=size,
    )


def peek(data_dir: Path) -> list[dict[str, Any]]:
    """The stored sessions' records, without their snapshots (listing)."""
    folder = _folder(data_dir)
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        if entry.name.endswith(".json") and _ID.match(entry.name[:-5]):
            try:
                record = json.loads(Path(entry.path).read_text(encoding="utf-8"))
                snap = folder / f"{entry.name[:-5]}.snap"
                record["snapshot_bytes"] = snap.stat().st_size
                record.pop("histories", None)
                out.append(record)
            except (OSError, ValueError):
                continue
    return out


def drop_older_than(data_dir: Path, max_age_s: float) -> None:
    """Remove stored sessions past their maximum age (never taken back), closed markers, and
    snapshot files no record names that were last written longer ago than that: a live session's
    snapshot is rewritten at each release, and its session ends at that age (a crashed process's
    are older)."""
    now = time.time()
    for record in peek(data_dir):
        if now - float(record.get("created_at") or 0) >= max_age_s:
            discard(data_dir, str(record["session_id"]))
    try:
        entries = list(os.scandir(_folder(data_dir)))
    except OSError:
        return
    records = {entry.name[:-5] for entry in entries if entry.name.endswith(".json")}
    for entry in entries:
        session_id = entry.name.split(".", 1)[0]
        leftover = ".snap" in entry.name or entry.name.endswith(".spool")
        if not entry.name.endswith(CLOSED) and (not leftover or session_id in records):
            continue
        try:
            if now - entry.stat().st_mtime >= max_age_s:
                os.unlink(entry.path)
        except OSError:
            continue


CLOSED = ".closed"


def close(data_dir: Path, session_id: str, owner: str) -> bool:
    """Remove a stored session and mark it closed by `owner`; whether there was one."""
    if not discard(data_dir, session_id):
        return False
    try:
        _write(_folder(data_dir) / f"{session_id}{CLOSED}", owner.encode("utf-8"))
    except OSError:  # the marker only improves a later message: the session is closed anyway
        pass
    return True


def closed_by(data_dir: Path, session_id: str) -> str | None:
    """The owner who closed a stored session with `close`, or None when it was not."""
    if not _ID.match(session_id):
        return None
    try:
        return (_folder(data_dir) / f"{session_id}{CLOSED}").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def discard(data_dir: Path, session_id: str) -> bool:
    """Remove a stored session; whether there was one."""
    if not _ID.match(session_id):
        return False
    found = False
    for suffix in (".json", ".snap"):
        try:
            (_folder(data_dir) / f"{session_id}{suffix}").unlink()
            found = True
        except OSError:
            pass
    return found
