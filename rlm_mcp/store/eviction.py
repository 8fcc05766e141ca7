"""Which stored contexts an eviction removes: one rule for every store (SQLite and files;
PostgreSQL), which then deletes the rows and bytes `plan_eviction` names.

Evicted: rows no owner holds any more (deleted by every owner while a run still held them),
those unused for `store_max_age_days` (<= 0: no age cap), then least recently used ones until
the blobs fit `store_max_bytes` (each blob counted once: contexts share blobs). Never a context
pinned by a live run, nor an owned one named in `keep` or stored or used within
`context_grace_s`. With a `loader` (who just stored), that owner's own contexts go first
(`owner_caps.loader_first`).

Also here: the sweep of temp files left by a crashed process (`clean_stale_tmp`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm_mcp.config import StoreSettings
from rlm_mcp.observability import metrics
from rlm_mcp.store.owner_caps import loader_first

__all__ = ["STALE_TMP_S", "Eviction", "clean_stale_tmp", "plan_eviction"]

# Temp files older than this are leftovers of a crashed process.
STALE_TMP_S = 24 * 3600


@dataclass(frozen=True)
class Eviction:
    context_id: str
    sha256: str
    last_of_blob: bool  # no remaining context row uses the blob: its bytes go too


def plan_eviction(
    rows: Sequence[Any],
    owners: dict[str, set[str]],
    *,
    settings: StoreSettings,
    loader: str | None,
    pinned: Collection[str],
    keep: Collection[str],
    now: float,
) -> list[Eviction]:
    """What to evict, in order. `rows`: every context, least recently used first, each with
    context_id, sha256, bytes, last_used_at and owned (whether any owner holds it); `owners`
    maps context ids to their owners; `pinned`: ids a live run uses."""
    max_age = float(settings.store_max_age_days) * 86400
    cap = settings.store_max_bytes
    grace = float(settings.context_grace_s)
    rows = loader_first(rows, owners, loader)
    refs = Counter(r["sha256"] for r in rows)
    sizes = {r["sha256"]: r["bytes"] for r in rows}
    total = sum(sizes.values())  # blobs are shared: count each content once
    planned: list[Eviction] = []
    for r in rows:
        if r["context_id"] in pinned:
            continue
        if r["owned"]:  # an orphan (no owner left) goes whatever its age
            if r["context_id"] in keep or now - r["last_used_at"] < grace:
                continue
            expired = max_age > 0 and now - r["last_used_at"] > max_age
            if not expired and total <= cap:
                continue
        refs[r["sha256"]] -= 1
        last = refs[r["sha256"]] == 0
        if last:
            total -= sizes[r["sha256"]]
        planned.append(Eviction(r["context_id"], r["sha256"], last))
    # Every store evicts exactly what this plan names, so the plan is where the gauges are set.
    metrics.context_store(total, len(planned))
    return planned


def clean_stale_tmp(tmp_dir: Path, now: float) -> None:
    """Remove files in `tmp_dir` older than `STALE_TMP_S` (leftovers of a crashed process)."""
    try:
        entries = list(os.scandir(tmp_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and now - entry.stat().st_mtime > STALE_TMP_S:
                os.unlink(entry.path)
        except OSError:
            pass  # another process removed or renamed it first
