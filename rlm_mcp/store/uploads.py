"""Chunked, resumable uploads (rlm_upload_context): the protocol, written once over an upload
index (`store.index.UploadIndex`): SQLite and files (`store.sqlite_uploads.UploadStore`) or PostgreSQL
(`store.pg.uploads.PgUploadStore`). State survives a restart and is shared by every process on
the store, so consecutive chunks may land on different servers. The protocol:

* index 0 without upload_id starts an upload; the reply carries the issued upload_id;
* each later chunk carries upload_id and the next index; resending the last stored index with
  identical bytes is a no-op (a client retrying after a lost reply), any other index is an
  error naming the expected one;
* the chunk with final=True marks the upload finalizing (later appends are refused) and
  completes it: the chunks are streamed into the context store, checked against sha256 when
  given (on mismatch, or any failure, the mark is cleared and the upload stays, so the caller
  can resend the final chunk), and deleted;
* unfinished uploads count against the owner's share and RLM_MCP_STORE_MAX_BYTES;
* uploads untouched for UPLOAD_TTL_S are removed, finished ones included; ages are by the
  transaction's `now` (`store.index`: the database's clock in team mode).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import StoreSettings
from rlm_mcp.errors import BadArgumentError, context_too_large, uploads_over_store_cap
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.store.contexts import Contexts
from rlm_mcp.store.index import Row, UploadIndex, UploadTx
from rlm_mcp.store.owner_caps import check_pending_uploads, may_continue_upload
from rlm_mcp.store.upload_model import (
    MAX_CHUNK_BYTES,
    UPLOAD_ID,
    UPLOAD_TTL_S,
    UploadState,
    check_chunk,
    new_upload_id,
    unknown_upload,
)

__all__ = ["MAX_CHUNK_BYTES", "UPLOAD_TTL_S", "UploadState", "Uploads"]

log = logging.getLogger("rlm_mcp.store")


class Uploads:
    def __init__(self, settings: StoreSettings, contexts: Contexts, index: UploadIndex) -> None:
        self.settings = settings
        self._contexts = contexts
        self._index = index
        self._sql = index.sql

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
    ) -> UploadState:
        """The upload belongs to the owner that started it: another owner's chunks meet an
        unknown upload id (`owner_caps.may_continue_upload`); `owner` owns the stored context."""
        check_chunk(data, index, format, sha256)
        row = await self._store(data, index, upload_id, name, format, final, owner)
        if row["done"] or not final:
            return await self._state(row, owner)
        try:
            return await self._finalize(row, sha256, owner)
        except BaseException:
            # Not stored (a digest mismatch, a full disk): the caller may resend the final chunk.
            with anyio.CancelScope(shield=True):
                await self._index.clear_finalizing(row["upload_id"])
            raise

    # --- storing a chunk -----------------------------------------------------------------

    async def _store(
        self,
        data: bytes,
        index: int,
        upload_id: str | None,
        name: str | None,
        format: str | None,
        final: bool,
        owner: Owner,
    ) -> Row:
        fresh = upload_id is None
        if upload_id is None:
            if index != 0:
                raise BadArgumentError(
                    f"Chunk {index} came without an upload_id.",
                    "Start an upload with chunk index 0 and no upload_id; send the upload_id of its reply with every later chunk.",
                )
            upload_id = new_upload_id()
        elif not UPLOAD_ID.match(upload_id):
            raise unknown_upload(upload_id)
        chunk_sha = hashlib.sha256(data).hexdigest()
        staged = await self._index.stage(data)
        try:
            async with self._index.write() as tx:
                now = await tx.now()
                await tx.expire(now - UPLOAD_TTL_S)
                if fresh:
                    await self._start(tx, staged, len(data), upload_id, chunk_sha, name, format, owner, now)
                else:
                    row = await tx.one(self._sql.upload_row_locked, (upload_id,))
                    if row is None or not may_continue_upload(row["owner"], owner):
                        raise unknown_upload(upload_id)  # another owner's: as if it did not exist
                    if await self._apply(tx, row, staged, len(data), index, chunk_sha, owner):
                        return row
                    await tx.execute(self._sql.touch_upload, (name, format, now, upload_id))
                if final:
                    await tx.set_finalizing(upload_id)
                stored = await tx.one(self._sql.upload_row, (upload_id,))
                assert stored is not None  # written in this transaction
                return stored
        finally:
            await self._index.discard(staged)

    async def _start(
        self,
        tx: UploadTx,
        staged: Any,
        size: int,
        upload_id: str,
        chunk_sha: str,
        name: str | None,
        format: str | None,
        owner: Owner,
        now: float,
    ) -> None:
        self._check_total(size)
        await self._check_store_room(tx, size, owner)
        await tx.execute(self._sql.insert_upload, (upload_id, size, chunk_sha, name, format, now, now, owner))
        await tx.add_chunk(upload_id, 0, staged)

    async def _apply(
        self, tx: UploadTx, row: Row, staged: Any, size: int, index: int, chunk_sha: str, owner: Owner
    ) -> bool:
        """Apply one later chunk to the upload's row; True when it changes nothing (a done upload's resend)."""
        upload_id = row["upload_id"]
        expected = row["next_index"]
        resend = index == expected - 1 and chunk_sha == row["last_chunk_sha"]
        if row["done"]:
            if resend:
                return True
            raise BadArgumentError(
                f"Upload '{upload_id}' is already complete (context '{row['context_id']}').",
                "Use that context_id; to store other data start a new upload with index 0 and no upload_id.",
            )
        if index == expected - 1 and not resend:
            raise BadArgumentError(
                f"Chunk {index} of upload '{upload_id}' was already stored with different bytes.",
                f"Send the next chunk, index {expected}; to change stored data, start a new upload.",
            )
        if resend:
            return False
        if await tx.is_finalizing(row):
            raise BadArgumentError(
                f"Upload '{upload_id}' is being completed: its final chunk arrived, so chunk {index} cannot be added.",
                "Wait for the final chunk's reply; to store other data start a new upload with index 0.",
            )
        if index != expected:
            raise BadArgumentError(
                f"Chunk index {index} is out of order: upload '{upload_id}' expects index {expected}.",
                f"Send chunk {expected} next (and the ones after it in order).",
            )
        self._check_total(row["bytes_received"] + size)
        await self._check_store_room(tx, size, owner)
        await tx.add_chunk(upload_id, index, staged)
        await tx.execute(self._sql.advance_upload, (index + 1, row["bytes_received"] + size, chunk_sha, upload_id))
        return False

    def _check_total(self, total: int) -> None:
        if total > self.settings.max_context_bytes:
            raise context_too_large(self.settings.max_context_bytes)

    async def _check_store_room(self, tx: UploadTx, adding: int, owner: Owner) -> None:
        """Unfinished uploads count against RLM_MCP_STORE_MAX_BYTES: unlike stored contexts they
        cannot be evicted, so without this they could fill the disk past the cap. The caller's
        own count against its share first (`owner_caps.check_pending_uploads`). One owner's
        chunks queue on a lock of that owner's, so two writers cannot both spend the same room."""
        await tx.lock_owner(owner)
        own = await tx.one(self._sql.pending_own, (owner,))
        check_pending_uploads(self.settings, int(own["n"]) if own else 0, adding)
        every = await tx.one(self._sql.pending_all)
        pending = int(every["n"]) if every else 0
        cap = self.settings.store_max_bytes
        if pending + adding > cap:
            raise uploads_over_store_cap(pending, adding, cap)

    # --- completing ----------------------------------------------------------------------

    async def _finalize(self, row: Row, sha256: str | None, owner: Owner) -> UploadState:
        upload_id = row["upload_id"]
        count = row["next_index"]
        fmt: ContextFormat = "json" if row["format"] == "json" else "text"
        described = {"type": "upload", "upload_id": upload_id, "chunks": count, "bytes": row["bytes_received"]}
        expected = sha256.strip().lower() if sha256 else None
        name = row["name"] or f"upload {upload_id}"
        try:
            async with self._index.assembled(upload_id, count) as data:
                if isinstance(data, Path):
                    info = await self._contexts.put_file(
                        data,
                        name=name,
                        format=fmt,
                        source=described,
                        consume=True,
                        expected_sha256=expected,
                        owner=owner,
                    )
                else:
                    info = await self._contexts.put_chunks(
                        data, name=name, format=fmt, source=described, expected_sha256=expected, owner=owner
                    )
        except FileNotFoundError:
            # A concurrent final chunk completed the upload and removed its chunks first.
            row = await self._row(upload_id)
            if row["done"]:
                return await self._state(row, owner)
            raise
        async with self._index.write() as tx:
            await tx.execute(self._sql.upload_done, (info.context_id, await tx.now(), upload_id))
            done_row = await tx.one(self._sql.upload_row, (upload_id,))
            assert done_row is not None  # written in this transaction
        await self._index.finished(upload_id)
        log.info("upload %s complete: %s", upload_id, info.context_id)
        return UploadState(
            upload_id=upload_id,
            next_index=done_row["next_index"],
            bytes_received=done_row["bytes_received"],
            done=True,
            context=info,
        )

    async def _row(self, upload_id: str) -> Row:
        async with self._index.read() as tx:
            row = await tx.one(self._sql.upload_row, (upload_id,))
        if row is None:
            raise unknown_upload(upload_id)
        return row

    async def _state(self, row: Row, owner: Owner) -> UploadState:
        context = await self._contexts.get(row["context_id"], owner=owner) if row["done"] else None
        return UploadState(
            upload_id=row["upload_id"],
            next_index=row["next_index"],
            bytes_received=row["bytes_received"],
            done=bool(row["done"]),
            context=context,
        )
