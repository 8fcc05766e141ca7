"""A run whose final record the store refused for what it holds, not because it was out of reach.

A store out of reach (PostgreSQL restarting: `StoreUnreachableError`; a full disk in embedded
mode) may take the same record later, and a team worker retries it (`queue/final_writes.py`).
Any other refusal (text that cannot be encoded, a value the database rejects) refuses every
retry alike: retried, the run would stay `running` for good and hold its slot; dropped, its
caller would never learn how it ended. Such a run is recorded `error` instead, saying why,
without its answer (the part a refusal is about).
"""

from __future__ import annotations

import sqlite3

from rlm_mcp.errors import StoreUnreachableError
from rlm_mcp.ports.runs import NOTICE_TEXT_MAX, Notice, NoticeKind, RunRecord

__all__ = ["store_unreachable", "unrecordable"]

_DETAIL_MAX = 300


def store_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says the store could not be reached (so the same write may land later)."""
    return isinstance(exc, (StoreUnreachableError, OSError, sqlite3.OperationalError))


def refusal(exc: BaseException) -> str:
    """The refusal in one bounded line of valid text (its message may quote what was refused)."""
    lines = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
    return detail[: min(_DETAIL_MAX, NOTICE_TEXT_MAX)]


def unrecordable(record: RunRecord, exc: BaseException) -> RunRecord:
    """`record` ended `error`: the store refused it (`exc`), which its reason and notice say."""
    notice = Notice(kind=NoticeKind.RECORD_REFUSED, text=refusal(exc))
    duration = record.result.duration_s if record.result is not None else None
    return record.ended("error", notice.render(), duration_s=duration, notice=notice)
