"""Caps kept per owner, so one owner's volume never removes another's things (issue 20 item 8).

Pure selection logic, so any store (files, SQLite, PostgreSQL) applies the same rule.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

__all__ = ["beyond_newest_per_owner"]


def beyond_newest_per_owner(items: Iterable[tuple[str, float, str]], keep: int) -> list[str]:
    """`items` are (owner, time, id); the ids beyond each owner's newest `keep`."""
    by_owner: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for owner, when, key in items:
        by_owner[owner].append((when, key))
    dropped: list[str] = []
    for entries in by_owner.values():
        entries.sort(reverse=True)
        dropped += [key for _, key in entries[max(0, keep) :]]
    return dropped
