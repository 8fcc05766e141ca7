"""Caps kept per owner, so one owner's volume never removes another's things.

Pure selection logic, so any store (files, SQLite, PostgreSQL) applies the same rule:

* run records: each owner keeps its newest (`beyond_newest_per_owner`);
* eviction over the store's cap: the loader's own contexts go first (`loader_first`);
* each owner's share of the store (`RLM_MCP_STORE_MAX_BYTES_PER_OWNER`, `store_share`; with
  several tokens and no share set, the store's cap divided by the number of tokens,
  `derived_share`, so one owner's loads never evict another's contexts): what an
  owner holds counts each distinct blob once, at its full size, whoever else holds the same
  bytes (a share that shrank when another owner stored the same bytes would tell the first one
  so). A new context first releases the owner's own least recently used ones
  (`release_for_share`; `releases_in_share` over a store's rows and pins); one a run of the
  owner uses, or stored or used within `RLM_MCP_CONTEXT_GRACE_S`, is never released, and when
  those alone leave no room the store refuses it;
* unfinished uploads: recorded with the owner that started them (only that owner may continue
  one, `may_continue_upload`), and each owner's pending bytes kept within its share
  (`check_pending_uploads`), apart from the contexts it holds.

Every refusal speaks of the caller's own usage only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rlm_mcp.config import StoreSettings
from rlm_mcp.errors import owner_share_full, owner_uploads_full

_Row = TypeVar("_Row", bound=Any)

__all__ = [
    "Held",
    "Release",
    "beyond_newest_per_owner",
    "check_pending_uploads",
    "derived_share",
    "loader_first",
    "may_continue_upload",
    "release_for_share",
    "releases_in_share",
    "store_share",
]


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


def derived_share(settings: StoreSettings, tokens: int) -> tuple[int | None, str]:
    """Each owner's share with `tokens` accepted tokens, and where it comes from (said in the
    start log and by `doctor`). A share set on purpose stands; with several tokens and none set,
    the store's cap divided among them, so that all shares together fit the cap: an owner's
    loads then release its own contexts and never push out another owner's. One token (or
    none): no share beyond the cap."""
    size = _size
    if settings.store_max_bytes_per_owner is not None:
        share = settings.store_max_bytes_per_owner
        return share, f"{size(share)} per owner (RLM_MCP_STORE_MAX_BYTES_PER_OWNER)"
    if tokens > 1:
        share = max(1, settings.store_max_bytes // tokens)
        return share, (
            f"{size(share)} per owner: RLM_MCP_STORE_MAX_BYTES ({size(settings.store_max_bytes)}) / {tokens} tokens; "
            "set RLM_MCP_STORE_MAX_BYTES_PER_OWNER to choose another"
        )
    return None, f"none: one owner, the store's cap ({size(settings.store_max_bytes)}) alone"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


def store_share(settings: StoreSettings) -> int | None:
    """Each owner's share of the store in bytes, or None when no share is set."""
    return settings.store_max_bytes_per_owner


@dataclass(frozen=True)
class Held:
    """One context an owner holds, as that owner sees it."""

    context_id: str
    sha256: str
    bytes: int
    last_used_at: float  # the owner's own last store or use
    in_use: bool  # pinned by a run of this owner


def release_for_share(
    held: Sequence[Held], *, adding_sha256: str, adding_bytes: int, share: int | None, now: float, grace_s: float
) -> list[str]:
    """The ids of `held` (one owner's contexts) to release, least recently used first, so that
    with the new content (`adding_*`) what the owner holds fits `share`. Raises `TooLargeError`
    (about the owner's own usage only) when the contexts that may not be released leave no room."""
    sizes = {h.sha256: h.bytes for h in held}
    if share is None or adding_sha256 in sizes:
        return []  # no share, or bytes the owner holds already: nothing new counts
    total = sum(sizes.values())
    if total + adding_bytes <= share:
        return []
    if adding_bytes > share:
        raise owner_share_full(adding_bytes, share, kept=None, grace_s=grace_s)
    refs = Counter(h.sha256 for h in held)
    released: list[str] = []
    for h in sorted(held, key=lambda h: h.last_used_at):
        if total + adding_bytes <= share:
            break
        if h.in_use or now - h.last_used_at < grace_s:
            continue
        released.append(h.context_id)
        refs[h.sha256] -= 1
        if refs[h.sha256] == 0:
            total -= h.bytes
    if total + adding_bytes > share:
        raise owner_share_full(adding_bytes, share, kept=total, grace_s=grace_s)
    return released


@dataclass(frozen=True)
class Release:
    """One context an owner lets go of to make room (as that owner's delete)."""

    context_id: str
    sha256: str
    in_a_run: bool  # a live run of any owner uses it: the row and bytes stay until it ends


def releases_in_share(
    settings: StoreSettings,
    rows: Iterable[Any],
    pins: Iterable[tuple[str, str | None]],
    *,
    owner: str,
    adding_sha256: str,
    adding_bytes: int,
    now: float,
) -> list[Release]:
    """`release_for_share` over a store's rows: `rows` are `owner`'s contexts (context_id,
    sha256, bytes, and the owner's last_used_at), `pins` the (context_id, owner) of every live
    pin. Empty when no share is set; raises as `release_for_share` does."""
    share = store_share(settings)
    if share is None:
        return []
    pins = set(pins)
    rows = list(rows)
    held = [
        Held(r["context_id"], r["sha256"], r["bytes"], r["last_used_at"], (r["context_id"], owner) in pins)
        for r in rows
    ]
    released = release_for_share(
        held,
        adding_sha256=adding_sha256,
        adding_bytes=adding_bytes,
        share=share,
        now=now,
        grace_s=float(settings.context_grace_s),
    )
    shas = {r["context_id"]: r["sha256"] for r in rows}
    in_runs = {cid for cid, _ in pins}
    return [Release(cid, shas[cid], cid in in_runs) for cid in released]


def may_continue_upload(recorded: str | None, caller: str) -> bool:
    """Whether `caller` may add chunks to an upload started by `recorded`. Uploads started
    before owners were recorded (None) stay open to whoever holds their id, as they were."""
    return recorded is None or recorded == caller


def check_pending_uploads(settings: StoreSettings, own_pending: int, adding: int) -> None:
    """Refuse a chunk that would put the caller's unfinished uploads past its share."""
    share = store_share(settings)
    if share is not None and own_pending + adding > share:
        raise owner_uploads_full(own_pending, adding, share)
