"""Pins in the SQLite index: which contexts live runs use, in every process sharing the data dir.

A pin row names its process (host, pid and the process's start time), so a pin whose process
died is ignored and removed by the next reader on the same host; a pin of another host cannot
be checked that way and lapses after `PIN_TTL_S`. Eviction and deletes skip pinned contexts.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from rlm_mcp.store import _db
from rlm_mcp.store.context_model import PIN_TTL_S

__all__ = ["ADD_PIN", "live_pins", "pin_rows"]


ADD_PIN = "INSERT INTO pins VALUES (?, ?, ?, ?, ?, ?, ?)"


@functools.lru_cache(maxsize=4)
def _start_of(pid: int) -> str | None:
    return _db.proc_start(pid)


def pin_rows(pin_id: str, context_ids: Sequence[str], owner: str, now: float) -> list[tuple[Any, ...]]:
    """The rows (for `ADD_PIN`) that pin `context_ids` for this process under `pin_id`."""
    pid = os.getpid()
    start = _start_of(pid)  # a process's start time never changes
    return [(pin_id, cid, _db.HOST, pid, start, now + PIN_TTL_S, owner) for cid in context_ids]


def live_pins(conn: sqlite3.Connection, now: float) -> set[tuple[str, str | None]]:
    """(context_id, owner) of every live pin; dead ones are removed on the way."""
    live: set[tuple[str, str | None]] = set()
    for pin in conn.execute("SELECT rowid, * FROM pins").fetchall():
        alive = pin["expires_at"] > now and (pin["host"] != _db.HOST or _db.pid_alive(pin["pid"], pin["proc_start"]))
        if alive:
            live.add((pin["context_id"], pin["owner"]))
        else:
            conn.execute("DELETE FROM pins WHERE rowid = ?", (pin["rowid"],))
    return live
