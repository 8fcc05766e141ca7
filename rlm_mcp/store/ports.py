"""The store interface the service layer uses: contexts, uploads and run records.

Two implementations satisfy it: SQLite and files in the data dir (the embedded default,
`rlm_mcp.store.contexts` / `uploads` / `runs`) and PostgreSQL (`rlm_mcp.store.pg`, team mode).
`open_stores` (`rlm_mcp.store.factory`) picks one from the settings; nothing above this layer
knows which it got.

Every entry point that reads or writes owned data takes the owner as a required keyword
(`rlm_mcp.owners`): writes an `Owner`, reads an `OwnerScope`.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

from rlm_mcp.call_lines import CallLine
from rlm_mcp.events import EventKey, LoggedEvent, RunEvent
from rlm_mcp.owners import Owner, OwnerScope
from rlm_mcp.ports import ContextFormat, ContextSpec
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store._ingest import Ingested
from rlm_mcp.store.context_model import ContextInfo, HeldPins
from rlm_mcp.store.upload_model import UploadState


class ContextStorePort(Protocol):
    """Content-addressed contexts with per-owner names, pins and eviction."""

    async def put_bytes(
        self, data: bytes, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo: ...

    async def put_file(
        self,
        path: Path,
        *,
        name: str,
        format: ContextFormat,
        source: dict[str, Any],
        consume: bool = False,
        owner: Owner,
    ) -> ContextInfo: ...

    async def put_chunks(
        self,
        chunks: Iterable[bytes],
        *,
        name: str,
        format: ContextFormat,
        source: dict[str, Any],
        expected_sha256: str | None = None,
        owner: Owner,
    ) -> ContextInfo: ...

    async def get(self, context_id: str, *, owner: OwnerScope) -> ContextInfo: ...

    async def list(self, *, owner: OwnerScope) -> builtins.list[ContextInfo]: ...

    async def delete(self, context_id: str, *, owner: OwnerScope) -> bool: ...

    def spec(self, info: ContextInfo) -> ContextSpec:
        """Where the sandbox reads the bytes: a local file, present inside `in_use`."""
        ...

    def in_use(
        self, context_ids: Sequence[str], *, owner: Owner, held: HeldPins | None = None
    ) -> AbstractAsyncContextManager[builtins.list[ContextInfo]]: ...

    async def release(self, held: HeldPins) -> None:
        """Remove `held`'s pins when `in_use` never took them over (taken by a claim)."""
        ...

    async def evict(self, *, keep: Sequence[str] = (), loader: Owner | None = None) -> builtins.list[str]: ...


class UploadStorePort(Protocol):
    async def put_chunk(
        self,
        *,
        data: bytes,
        index: int,
        upload_id: str | None,
        final: bool,
        sha256: str | None,
        name: str | None,
        format: ContextFormat | None,
        owner: Owner,
    ) -> UploadState: ...


class BlobPort(Protocol):
    """Where team mode keeps contexts' bytes, beneath the store's rules (`store.contexts`), which
    stay written once: the database's rows (`store.pg.blobs.RowBlobs`, the default) or a bucket
    (`store.pg.bucket_blobs.BucketBlobs`, RLM_MCP_BLOB_URL). `conn` is the index's transaction
    (the context's rows commit with it); both keep one copy per owner holding the content, so a
    load costs the same whether or not another owner stored those bytes."""

    where: str  # what failures name: "the database" or the bucket's s3:// URL

    async def put(self, conn: Any, ing: Ingested, owner: Owner, *, new: bool) -> None:
        """Store `owner`'s copy of the ingested bytes (`new`: no context had them yet)."""
        ...

    async def release(self, conn: Any, sha256: str) -> tuple[bool, builtins.list[str]]:
        """After a context of these bytes lost an owner or went: (whether the content is gone
        for good, the objects to remove once the transaction committed)."""
        ...

    def read(self, sha256: str) -> AsyncIterator[bytes]:
        """The content's bytes in order, a piece at a time (`UnknownIdError` when deleted)."""
        ...

    async def purge(self, keys: Sequence[str]) -> None:
        """After the commit: remove the objects `release` named (best effort: the sweep retries)."""
        ...


class RunLogPort(Protocol):
    """The open log of one run (one writer)."""

    @property
    def run_id(self) -> str: ...

    async def open(self) -> None:
        """The run starts: take what its log holds open (nothing is held while it is queued)."""
        ...

    async def append(self, event: RunEvent) -> None: ...

    async def append_call(self, call: CallLine) -> None:
        """`append(call.event())`: an LM call's event, appended from its line's values (the
        same line; a log that writes lines need not build the event's model)."""
        ...

    async def write_summary(self, record: RunRecord) -> None:
        """Replace the run's record (its live state, or its end)."""
        ...

    async def aclose(self) -> None: ...


class RunStorePort(Protocol):
    """Run records: a typed record (`rlm_mcp.ports.runs.RunRecord`, stored as its JSON) and an
    ordered event log per run id."""

    async def create(self, record: RunRecord) -> RunLogPort:
        """Store a new run's record; `BadArgumentError` when its run id exists."""
        ...

    async def read_summary(self, run_id: str, *, owner: OwnerScope) -> RunRecord:
        """The run's record (any version's, see `RunRecord.from_stored`); another owner's run
        is unknown (`NotFoundError`)."""
        ...

    async def read_events(
        self, run_id: str, *, owner: OwnerScope, limit_bytes: int | None = None
    ) -> builtins.list[LoggedEvent]: ...

    async def events_after(
        self, run_id: str, *, owner: OwnerScope, after: EventKey | None, limit: int
    ) -> builtins.list[tuple[EventKey, LoggedEvent]]:
        """Up to `limit` events of the run after the key `after` (None: from the start), in
        order, each with its key (the event stream's ids); `owner` as for read_summary."""
        ...

    async def version(self, run_id: str) -> str: ...

    async def prune(self, *, max_records: int, max_age_days: float) -> builtins.list[str]: ...

    async def list(self, limit: int = 50, *, owner: OwnerScope) -> builtins.list[RunRecord]:
        """`owner`'s records, the most recently created first."""
        ...
