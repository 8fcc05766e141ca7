"""Caps kept per owner, so one owner's volume never removes another's things (issue 20 item 8).

Pure selection logic, so any store (files, SQLite, PostgreSQL) applies the same rule.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

_Row = TypeVar("_Row", bound=Any)

__all__ = ["beyond_newest_per_owner", "loader_first"]


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


def loader_first(rows: Sequence[_Row], owners: dict[str, set[str]], loader: str | None) -> list[_Row]:
    """The eviction order when `loader` stores a context and the store is over its cap: the
    contexts `loader` alone holds first, least recently used first, then everyone else's (a
    context several owners hold, as its blob is shared, counts as everyone's). `rows` come
    least recently used first, each with a "context_id"; `owners` maps ids to their owners.
    So one owner's loads evict another owner's contexts only when its own cannot make room."""
    if loader is None:
        return list(rows)
    own = [r for r in rows if owners.get(r["context_id"]) == {loader}]
    return own + [r for r in rows if owners.get(r["context_id"]) != {loader}]
