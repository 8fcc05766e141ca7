"""One-time codes spent once (the viewer's login codes): who redeems a code first.

`SpentCodesPort.spend(code, expires_at)` answers True to the first caller for a code and False
to every later one, until the code has expired (its expiry is the caller's to check: a code
past it is refused before it gets here). The rule is `SpentCodes`, over a book of spent codes:
the embedded default keeps those of this process in memory (`LocalSpentCodes`); team mode keeps
them in PostgreSQL (`rlm_mcp.store.pg.spent_codes`), so a code spent on one replica is spent on
all of them. Only a hash of a code is kept.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["MAX_LOCAL", "CodeBook", "LocalSpentCodes", "SpentCodes", "SpentCodesPort", "code_digest"]

MAX_LOCAL = 65536  # a bound on memory: codes live a minute, each one asked for with the token


def code_digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


class SpentCodesPort(Protocol):
    async def spend(self, code: str, expires_at: float) -> bool:
        """True when this call spends `code` (valid until `expires_at`, Unix seconds); False when
        it was spent before."""
        ...


class CodeBook(Protocol):
    async def add_if_new(self, digest: str, expires_at: float, now: float) -> bool:
        """Record a spent code's digest; False when it was there (or cannot be recorded). `now`
        is this process's clock, for a book of this process; a shared book forgets expired
        codes by the clock its processes share (PostgreSQL: the database's)."""
        ...


class SpentCodes:
    """The first caller for a code spends it; only its digest is recorded."""

    def __init__(self, book: CodeBook) -> None:
        self._book = book
        self.clock: Callable[[], float] = time.time  # this process's

    async def spend(self, code: str, expires_at: float) -> bool:
        return await self._book.add_if_new(code_digest(code), expires_at, self.clock())


class MemoryCodeBook:
    """The spent codes of one process (no await between the check and the write: atomic)."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}

    async def add_if_new(self, digest: str, expires_at: float, now: float) -> bool:
        if len(self._spent) >= MAX_LOCAL:
            self._spent = {c: e for c, e in self._spent.items() if e > now}
            if len(self._spent) >= MAX_LOCAL:  # all unexpired: refuse rather than forget one
                return False
        if digest in self._spent:
            return False
        self._spent[digest] = expires_at
        return True


class LocalSpentCodes(SpentCodes):
    def __init__(self) -> None:
        super().__init__(MemoryCodeBook())
