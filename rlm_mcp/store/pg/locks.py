"""Every advisory-lock key of the team database, in one place: two modules taking one key for
different jobs would serialize (or deadlock) each other, which only a list like this one shows.

Single keys (`pg_advisory_lock(key)`, `pg_advisory_xact_lock(key)`) are the "rlm-mcp" base plus
a small number, or a key of their own; the two-part class is paired with `hashtext(owner)`.
"""

from __future__ import annotations

__all__ = [
    "CLAIM_LOCK_KEY",
    "ENQUEUE_LOCK_KEY",
    "EVICT_LOCK_KEY",
    "MIGRATION_LOCK_KEY",
    "OWNER_LOCK_CLASS",
    "SESSION_LOCK_KEY",
    "SNAPSHOT_OWNER_LOCK_CLASS",
]

MIGRATION_LOCK_KEY = 0x726C6D2D6D6370  # "rlm-mcp": one migrator at a time (`migrations.migrate`)
CLAIM_LOCK_KEY = MIGRATION_LOCK_KEY + 2  # one claim at a time: the owner share and order are exact (`queue`)
ENQUEUE_LOCK_KEY = MIGRATION_LOCK_KEY + 3  # the waiting bounds, counted and inserted under it (`queue`)
SESSION_LOCK_KEY = MIGRATION_LOCK_KEY + 5  # the per-owner session cap, counted and inserted under it (`sessions`)
EVICT_LOCK_KEY = 0x726C6D2D657663  # one evictor at a time across replicas (`contexts`)
OWNER_LOCK_CLASS = 0x726C6D6F  # with hashtext(owner): one owner's share is spent by one writer at a time (`contexts`)
# With hashtext(owner): the per-owner snapshot total is summed and written by one store at a time (`sessions`).
SNAPSHOT_OWNER_LOCK_CLASS = 0x726C6D06
