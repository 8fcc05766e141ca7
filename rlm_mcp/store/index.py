"""The narrow protocol beneath the store's rules: an index (rows) and blobs (bytes).

The rules (owner shares, pins, grace, eviction order, upload resends, caps, the upload state
machine, every error text) are written once, in `store.contexts` and `store.uploads`. They run
their statements (`store.statements`, rendered per dialect) inside a transaction of an index
and ask it only for what a dialect does its own way: locks, live pins, where bytes live.
Two implementations: SQLite and files in the data dir (`store.sqlite_index`,
`store.sqlite_uploads`) and PostgreSQL (`store.pg.contexts`, `store.pg.uploads`).

A row is indexed by column name (`sqlite3.Row` or psycopg's dict row).

The clock: every time a rule writes or compares (contexts' times, hence grace, eviction by age
and LRU order; uploads' ages) is the transaction's `now`, decided in one place per dialect:
SQLite's transaction reads this process's clock (`clock`, every process on a data dir shares
the host's), PostgreSQL's reads the database's with its BEGIN (`Database.clocked_transaction`),
so replicas whose own clocks disagree still agree on every age. An index's `clock` (this
process's) is left for what is local to the host: temp files' ages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

from rlm_mcp.owners import Owner
from rlm_mcp.store._ingest import Ingested
from rlm_mcp.store.context_model import ContextInfo
from rlm_mcp.store.statements import Statements

__all__ = ["ContextIndex", "IndexTx", "Row", "UploadIndex", "UploadTx"]

Row = Any  # sqlite3.Row or dict[str, Any]: both indexed by column name


class IndexTx(Protocol):
    """One transaction: committed when its block ends, rolled back when the block raises."""

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None: ...

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    async def now(self) -> float:
        """The time (Unix seconds) by the index's clock, the same for the whole transaction."""
        ...

    async def lock_owner(self, owner: Owner) -> None:
        """Until the transaction ends, one writer at a time spends `owner`'s share."""
        ...


class ContextTx(IndexTx, Protocol):
    async def lock_context(self, context_id: str) -> None: ...

    async def lock_eviction(self) -> None:
        """One evictor at a time, across every process sharing the store."""
        ...

    async def live_pins(self, now: float) -> set[tuple[str, str | None]]:
        """(context_id, owner) of every live pin; lapsed ones are removed on the way."""
        ...

    async def add_pins(self, pin_id: str, context_ids: Sequence[str], owner: Owner, now: float) -> None: ...

    async def put_blob(self, ing: Ingested, owner: Owner) -> None:
        """Store the ingested bytes for `owner` (the rows come after)."""
        ...

    async def release_blob(self, sha256: str) -> None:
        """After a context of these bytes lost an owner or went: drop the bytes no context uses."""
        ...

    async def blob_intact(self, row: Row) -> bool:
        """Whether a context's bytes are there (False: the caller answers "unknown id")."""
        ...


class ContextIndex(Protocol):
    sql: Statements
    tmp_dir: Path
    clock: Callable[[], float]  # this process's clock: for the host's own files

    def prepare(self) -> None:
        """Make the data dir (private) and its temp folder; blocking."""
        ...

    def local_path(self, sha256: str) -> Path:
        """Where a sandbox's bytes are read from on this host (present while a run pins them)."""
        ...

    def read(self) -> AbstractAsyncContextManager[ContextTx]: ...

    def write(self) -> AbstractAsyncContextManager[ContextTx]: ...

    async def present(self) -> bool:
        """False when nothing was ever stored (no eviction needed)."""
        ...

    async def adopt(self, ing: Ingested) -> None:
        """After the commit of new bytes: keep them where `local_path` says, if not there yet."""
        ...

    async def make_local(self, infos: Sequence[ContextInfo]) -> None:
        """Make sure the pinned contexts' bytes are at `local_path`."""
        ...


class UploadTx(IndexTx, Protocol):
    async def expire(self, cutoff: float) -> None:
        """Remove uploads untouched since `cutoff` (finished ones included) with their chunks."""
        ...

    async def add_chunk(self, upload_id: str, index: int, staged: Any) -> None: ...

    async def is_finalizing(self, row: Row) -> bool: ...

    async def set_finalizing(self, upload_id: str) -> None: ...


class UploadIndex(Protocol):
    sql: Statements

    def read(self) -> AbstractAsyncContextManager[UploadTx]: ...

    def write(self) -> AbstractAsyncContextManager[UploadTx]: ...

    async def stage(self, data: bytes) -> Any:
        """Hold a chunk's bytes before the transaction (SQLite: a temp file, written outside its lock)."""
        ...

    async def discard(self, staged: Any) -> None: ...

    async def clear_finalizing(self, upload_id: str) -> None: ...

    def assembled(self, upload_id: str, count: int) -> AbstractAsyncContextManager[Iterable[bytes] | Path]:
        """The upload's chunks in order: a blocking iterable of chunks, or a temp file the
        caller may consume. A chunk found missing raises FileNotFoundError or UnknownIdError."""
        ...

    async def finished(self, upload_id: str) -> None:
        """After the upload is marked done: remove what its chunks left behind."""
        ...
