"""Every SQL statement the store's rules run, written once and rendered per dialect.

The rules (`store.contexts`, `store.uploads`) run the same statements on SQLite (the embedded
index) and on PostgreSQL (team mode): each is written here once, in SQL both dialects read
(`ON CONFLICT ... DO UPDATE`, `TRUE`, `NOT done`, `COALESCE`), with `{table}` names and `?`
placeholders. `render` turns them into one `Statements` per dialect when the module loads:
PostgreSQL's tables carry the `rlm_` prefix and psycopg's `%s` placeholders. A statement only
one dialect can say (PostgreSQL's row locks and its finalizing mark) is an override of that
dialect's, next to the neutral one; what has no counterpart at all (pins judged by pid, blob
files, advisory locks) lives in that dialect's index (`store.sqlite_index`, `store.pg.contexts`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["POSTGRES", "SQLITE", "Statements", "render"]

# A context as one owner sees it: the shared content facts, the owner's own name, source, times.
_OWNED = (
    "SELECT c.context_id, c.sha256, c.bytes, c.format, c.kind, c.chars, "
    "o.name, o.source, o.created_at, o.last_used_at "
    "FROM {contexts} c JOIN {context_owners} o ON o.context_id = c.context_id"
)


@dataclass(frozen=True)
class Statements:
    """The statements of one dialect, by what they do."""

    # --- contexts ------------------------------------------------------------------------
    context_row: str = "SELECT * FROM {contexts} WHERE context_id = ?"
    owned_row: str = _OWNED + " WHERE c.context_id = ? AND o.owner = ?"
    list_all: str = "SELECT * FROM {contexts} ORDER BY last_used_at DESC"
    list_owned: str = _OWNED + " WHERE o.owner = ? ORDER BY o.last_used_at DESC"
    # The same bytes again: one context row, its name and source the latest given (the
    # operator's view); each owner has its own row, described by the latest name it gave.
    upsert_context: str = (
        "INSERT INTO {contexts} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (context_id) "
        "DO UPDATE SET name = excluded.name, source = excluded.source, last_used_at = excluded.last_used_at"
    )
    upsert_owner: str = (
        "INSERT INTO {context_owners} VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (context_id, owner) "
        "DO UPDATE SET name = excluded.name, source = excluded.source, last_used_at = excluded.last_used_at"
    )
    owner_contexts: str = (
        "SELECT c.context_id, c.sha256, c.bytes, o.last_used_at FROM {contexts} c "
        "JOIN {context_owners} o ON o.context_id = c.context_id WHERE o.owner = ?"
    )
    owned: str = "SELECT 1 FROM {context_owners} WHERE context_id = ? LIMIT 1"
    delete_ownership: str = "DELETE FROM {context_owners} WHERE context_id = ? AND owner = ?"
    delete_ownerships: str = "DELETE FROM {context_owners} WHERE context_id = ?"
    delete_context: str = "DELETE FROM {contexts} WHERE context_id = ?"
    touch_context: str = "UPDATE {contexts} SET last_used_at = ? WHERE context_id = ?"
    touch_ownership: str = "UPDATE {context_owners} SET last_used_at = ? WHERE context_id = ? AND owner = ?"
    remove_pin: str = "DELETE FROM {pins} WHERE pin_id = ?"
    eviction_rows: str = (
        "SELECT context_id, sha256, bytes, last_used_at, "
        "EXISTS (SELECT 1 FROM {context_owners} o WHERE o.context_id = c.context_id) AS owned "
        "FROM {contexts} c ORDER BY last_used_at ASC"
    )
    all_ownerships: str = "SELECT context_id, owner FROM {context_owners}"
    sha_in_use: str = "SELECT 1 FROM {contexts} WHERE sha256 = ? LIMIT 1"

    # --- uploads -------------------------------------------------------------------------
    upload_row: str = "SELECT * FROM {uploads} WHERE upload_id = ?"
    # The row a chunk is applied to. SQLite's write transaction already excludes every other
    # writer; PostgreSQL locks the row (two replicas receiving chunks of one upload queue here).
    upload_row_locked: str = "SELECT * FROM {uploads} WHERE upload_id = ?"
    insert_upload: str = (
        "INSERT INTO {uploads} (upload_id, next_index, bytes_received, last_chunk_sha, name, format, "
        "created_at, updated_at, owner) VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?)"
    )
    advance_upload: str = (
        "UPDATE {uploads} SET next_index = ?, bytes_received = ?, last_chunk_sha = ? WHERE upload_id = ?"
    )
    touch_upload: str = (
        "UPDATE {uploads} SET name = COALESCE(?, name), format = COALESCE(?, format), updated_at = ? "
        "WHERE upload_id = ?"
    )
    upload_done: str = "UPDATE {uploads} SET done = TRUE, context_id = ?, updated_at = ? WHERE upload_id = ?"
    pending_own: str = "SELECT COALESCE(SUM(bytes_received), 0) AS n FROM {uploads} WHERE NOT done AND owner = ?"
    pending_all: str = "SELECT COALESCE(SUM(bytes_received), 0) AS n FROM {uploads} WHERE NOT done"
    stale_uploads: str = "SELECT upload_id FROM {uploads} WHERE updated_at < ?"
    expire_uploads: str = "DELETE FROM {uploads} WHERE updated_at < ?"
    upload_ids: str = "SELECT upload_id FROM {uploads}"


_TABLES = ("contexts", "context_owners", "pins", "uploads")


def render(prefix: str, placeholder: str, **overrides: str) -> Statements:
    """The statements with `prefix` before every table name and `placeholder` for each `?`;
    `overrides` (neutral text too) replace the statements a dialect says its own way."""
    names = {t: prefix + t for t in _TABLES}
    neutral = Statements(**overrides)
    return Statements(
        **{f.name: getattr(neutral, f.name).format(**names).replace("?", placeholder) for f in fields(Statements)}
    )


SQLITE = render("", "?")
POSTGRES = render(
    "rlm_",
    "%s",
    upload_row_locked="SELECT * FROM {uploads} WHERE upload_id = ? FOR UPDATE",
    # The final chunk's mark (`finalizing`) is a column in PostgreSQL (a file in SQLite's data dir).
    upload_done=(
        "UPDATE {uploads} SET done = TRUE, finalizing = FALSE, context_id = ?, updated_at = ? WHERE upload_id = ?"
    ),
)
