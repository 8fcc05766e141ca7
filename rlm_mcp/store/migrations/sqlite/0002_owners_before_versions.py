"""Index files of the releases before the index carried a version may lack owners.

Files of 0.1, written before owners existed, have pins without an owner column (it came with
the `context_owners` table, which 0001 has just created empty): their contexts belong to the
local user (0.1 had one) and their pins gain the column. Files written before uploads recorded
their owner gain that column; their unfinished uploads have none (`owner_caps.may_continue_upload`)
and expire within a day. A file made by 0001 has every column: nothing changes.
"""

from __future__ import annotations

import sqlite3

LOCAL_OWNER = "local"  # rlm_mcp.owners.LOCAL_OWNER when this was written; a migration does not follow it


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def migrate(conn: sqlite3.Connection) -> None:
    if "owner" not in _columns(conn, "pins"):
        conn.execute(
            "INSERT OR IGNORE INTO context_owners "
            "SELECT context_id, ?, name, source, created_at, last_used_at FROM contexts",
            (LOCAL_OWNER,),
        )
        conn.execute("ALTER TABLE pins ADD COLUMN owner TEXT")
    if "owner" not in _columns(conn, "uploads"):
        conn.execute("ALTER TABLE uploads ADD COLUMN owner TEXT")
