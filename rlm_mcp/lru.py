"""A bounded map that forgets its least recently used entry.

Several parts of a process remember a bounded number of recent things (routing tokens, the
contexts a team front read, follow notes, ended sessions, kept SQLite connections). `LruMap` is
their one map: at most `bound` entries; storing one past the bound drops the least recently used,
handing each dropped entry to `on_evict` (a kept connection is closed there).

What counts as a use is the caller's to say, so each says it explicitly: `put` and `use` mark an
entry most recently used; `get`, `in` and `pop` do not. Not thread-safe: a caller that shares one
between threads holds its own lock around it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["LruMap"]

K = TypeVar("K")
V = TypeVar("V")


class LruMap(Generic[K, V]):
    """At most `bound` entries, the least recently used dropped first (the module's rule)."""

    def __init__(self, bound: int, *, on_evict: Callable[[K, V], None] | None = None) -> None:
        if bound < 0:
            raise ValueError(f"bound must be >= 0, not {bound}")
        self.bound = bound
        self._on_evict = on_evict
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether `key` is held (not a use)."""
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        """The keys, least recently used first (not a use)."""
        return iter(self._entries)

    def get(self, key: K) -> V | None:
        """The value of `key`, or None (not a use: its place is unchanged)."""
        return self._entries.get(key)

    def use(self, key: K) -> V | None:
        """The value of `key`, marked most recently used; None when it is not held."""
        value = self._entries.get(key)
        if value is not None or key in self._entries:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store `value` under `key`, marked most recently used; then drop the least recently
        used entries past the bound, each handed to `on_evict`."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.bound:
            old_key, old_value = self._entries.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old_key, old_value)

    def pop(self, key: K) -> V | None:
        """Forget `key`; its value, or None (`on_evict` is not called: the caller has it)."""
        return self._entries.pop(key, None)
