"""`rlm_mcp.lru.LruMap`: at most `bound` entries, the least recently used dropped first and handed
to `on_evict`; `put` and `use` are uses, `get`, `in` and `pop` are not."""

from __future__ import annotations

import pytest

from rlm_mcp.lru import LruMap


def test_storing_past_the_bound_drops_the_least_recently_stored() -> None:
    dropped: list[tuple[str, int]] = []
    lru: LruMap[str, int] = LruMap(2, on_evict=lambda key, value: dropped.append((key, value)))
    lru.put("a", 1)
    lru.put("b", 2)
    assert dropped == []
    lru.put("c", 3)
    assert dropped == [("a", 1)]
    assert list(lru) == ["b", "c"]
    assert len(lru) == 2


def test_use_and_put_mark_an_entry_most_recently_used() -> None:
    lru: LruMap[str, int] = LruMap(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.use("a") == 1
    lru.put("c", 3)  # "b" is now the least recently used
    assert list(lru) == ["a", "c"]
    lru.put("a", 10)  # storing again replaces the value and is a use
    lru.put("d", 4)
    assert list(lru) == ["a", "d"]
    assert lru.get("a") == 10


def test_get_in_and_iteration_are_not_uses() -> None:
    lru: LruMap[str, int] = LruMap(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1
    assert "a" in lru
    assert list(lru) == ["a", "b"]
    lru.put("c", 3)
    assert "a" not in lru
    assert lru.get("a") is None


def test_an_absent_key_reads_as_none_and_is_not_made() -> None:
    lru: LruMap[str, int] = LruMap(2)
    assert lru.get("x") is None
    assert lru.use("x") is None
    assert lru.pop("x") is None
    assert len(lru) == 0


def test_use_moves_an_entry_whose_value_is_none() -> None:
    lru: LruMap[str, None] = LruMap(2)
    lru.put("a", None)
    lru.put("b", None)
    lru.use("a")
    lru.put("c", None)
    assert list(lru) == ["a", "c"]


def test_pop_forgets_without_calling_on_evict() -> None:
    dropped: list[str] = []
    lru: LruMap[str, int] = LruMap(2, on_evict=lambda key, _: dropped.append(key))
    lru.put("a", 1)
    assert lru.pop("a") == 1
    assert "a" not in lru
    assert dropped == []


def test_a_bound_of_zero_keeps_nothing_and_a_negative_one_is_refused() -> None:
    dropped: list[str] = []
    lru: LruMap[str, int] = LruMap(0, on_evict=lambda key, _: dropped.append(key))
    lru.put("a", 1)
    assert len(lru) == 0
    assert dropped == ["a"]
    with pytest.raises(ValueError):
        LruMap(-1)
