"""Chunked uploads in PostgreSQL (team mode): the protocol of `rlm_mcp.store.uploads`, with the
state and the chunks in the database, so consecutive chunks may land on different replicas.

Each chunk is applied in one transaction that locks the upload's row (`FOR UPDATE`), so two
replicas receiving chunks of one upload agree on the next index. The final chunk marks the row
`finalizing` (later appends are refused), streams the chunks into a local temp file, stores it
as a context and marks the upload done; on failure the mark is cleared so the final chunk may be
sent again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, context_too_large, uploads_over_store_cap
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.store._ingest import ingest, read_file_chunks
from rlm_mcp.store.owner_caps import check_pending_uploads, may_continue_upload
from rlm_mcp.store.pg.contexts import OWNER_LOCK_CLASS, PgContextStore
from rlm_mcp.store.pg.db import Conn, Database
from rlm_mcp.store.uploads import _UPLOAD_ID, UPLOAD_TTL_S, UploadState, _unknown, check_chunk

log = logging.getLogger("rlm_mcp.store")


class PgUploadStore:
    def __init__(self, settings: Settings, contexts: PgContextStore, db: Database) -> None:
        self._settings = settings
        self._contexts = contexts
        self._db = db

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
        check_chunk(data, index, format, sha256)
        row = await self._store(data, index, upload_id, name, format, final, owner)
        if row["done"] or not final:
            return await self._state(row, owner)
        try:
            return await self._finalize(row, sha256, owner)
        except BaseException:
            with anyio.CancelScope(shield=True):
                async with self._db.connection() as conn:
                    await conn.execute(
                        "UPDATE rlm_uploads SET finalizing = false WHERE upload_id = %s", (row["upload_id"],)
                    )
            raise

    async def _store(
        self,
        data: bytes,
        index: int,
        upload_id: str | None,
        name: str | None,
        format: str | None,
        final: bool,
        owner: Owner,
    ) -> dict[str, Any]:
        now = time.time()
        chunk_sha = hashlib.sha256(data).hexdigest()
        async with self._db.transaction() as conn:
            await conn.execute("DELETE FROM rlm_uploads WHERE updated_at < %s", (now - UPLOAD_TTL_S,))
            if upload_id is None:
                if index != 0:
                    raise BadArgumentError(
                        f"Chunk {index} came without an upload_id.",
                        "Start an upload with chunk index 0 and no upload_id; send the upload_id of its reply with every later chunk.",
                    )
                upload_id = "upl_" + secrets.token_hex(12)
                self._check_total(len(data))
                await self._check_store_room(conn, len(data), owner)
                await conn.execute(
                    "INSERT INTO rlm_uploads (upload_id, next_index, bytes_received, last_chunk_sha, name, format, "
                    "created_at, updated_at, owner) VALUES (%s, 1, %s, %s, %s, %s, %s, %s, %s)",
                    (upload_id, len(data), chunk_sha, name, format, now, now, owner),
                )
                await conn.execute("INSERT INTO rlm_upload_chunks VALUES (%s, 0, %b)", (upload_id, data))
            else:
                if not _UPLOAD_ID.match(upload_id):
                    raise _unknown(upload_id)
                cur = await conn.execute("SELECT * FROM rlm_uploads WHERE upload_id = %s FOR UPDATE", (upload_id,))
                row = await cur.fetchone()
                if row is None or not may_continue_upload(row["owner"], owner):
                    raise _unknown(upload_id)  # another owner's: as if it did not exist
                if await self._apply(conn, row, data, index, chunk_sha, final, owner):
                    return row
                await conn.execute(
                    "UPDATE rlm_uploads SET name = COALESCE(%s, name), format = COALESCE(%s, format), "
                    "updated_at = %s WHERE upload_id = %s",
                    (name, format, now, upload_id),
                )
            if final:
                await conn.execute(
                    "UPDATE rlm_uploads SET finalizing = true WHERE upload_id = %s AND NOT done", (upload_id,)
                )
            cur = await conn.execute("SELECT * FROM rlm_uploads WHERE upload_id = %s", (upload_id,))
            stored = await cur.fetchone()
            assert stored is not None  # written in this transaction
            return stored

    async def _apply(
        self, conn: Conn, row: dict[str, Any], data: bytes, index: int, chunk_sha: str, final: bool, owner: Owner
    ) -> bool:
        """Apply one later chunk to a locked row; True when it changes nothing (a done upload's resend)."""
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
        if not resend and row["finalizing"]:
            raise BadArgumentError(
                f"Upload '{upload_id}' is being completed: its final chunk arrived, so chunk {index} cannot be added.",
                "Wait for the final chunk's reply; to store other data start a new upload with index 0.",
            )
        if not resend:
            if index != expected:
                raise BadArgumentError(
                    f"Chunk index {index} is out of order: upload '{upload_id}' expects index {expected}.",
                    f"Send chunk {expected} next (and the ones after it in order).",
                )
            self._check_total(row["bytes_received"] + len(data))
            await self._check_store_room(conn, len(data), owner)
            await conn.execute("INSERT INTO rlm_upload_chunks VALUES (%s, %s, %b)", (upload_id, index, data))
            await conn.execute(
                "UPDATE rlm_uploads SET next_index = %s, bytes_received = %s, last_chunk_sha = %s WHERE upload_id = %s",
                (index + 1, row["bytes_received"] + len(data), chunk_sha, upload_id),
            )
        return False

    def _check_total(self, total: int) -> None:
        if total > self._settings.max_context_bytes:
            raise context_too_large(self._settings.max_context_bytes)

    async def _check_store_room(self, conn: Conn, adding: int, owner: Owner) -> None:
        """As the SQLite store's: the caller's own unfinished uploads within its share, then every
        owner's within RLM_MCP_STORE_MAX_BYTES. One owner's chunks queue on a lock of that
        owner's (the store's share lock), so two replicas cannot both spend the same room."""
        await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (OWNER_LOCK_CLASS, owner))
        cur = await conn.execute(
            "SELECT COALESCE(SUM(bytes_received), 0) AS n FROM rlm_uploads WHERE NOT done AND owner = %s", (owner,)
        )
        own = await cur.fetchone()
        check_pending_uploads(self._settings, int(own["n"]) if own else 0, adding)
        cur = await conn.execute("SELECT COALESCE(SUM(bytes_received), 0) AS n FROM rlm_uploads WHERE NOT done")
        row = await cur.fetchone()
        pending = int(row["n"]) if row else 0
        cap = self._settings.store_max_bytes
        if pending + adding > cap:
            raise uploads_over_store_cap(pending, adding, cap)

    async def _finalize(self, row: dict[str, Any], sha256: str | None, owner: Owner) -> UploadState:
        upload_id = row["upload_id"]
        await anyio.to_thread.run_sync(self._contexts._prepare)
        fd, name = tempfile.mkstemp(dir=self._contexts.tmp_dir, prefix="upload-", suffix=".tmp")
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                async with self._db.connection() as conn:
                    for idx in range(row["next_index"]):
                        cur = await conn.execute(
                            "SELECT data FROM rlm_upload_chunks WHERE upload_id = %s AND idx = %s",
                            (upload_id, idx),
                            binary=True,
                        )
                        part = await cur.fetchone()
                        if part is None:
                            raise _unknown(upload_id)
                        await anyio.to_thread.run_sync(out.write, bytes(part["data"]))
            fmt: ContextFormat = "json" if row["format"] == "json" else "text"
            expected = sha256.strip().lower() if sha256 else None

            def scan() -> Any:
                return ingest(
                    read_file_chunks(tmp),
                    tmp_dir=self._contexts.tmp_dir,
                    format=fmt,
                    max_bytes=self._settings.max_context_bytes,
                    expected_sha256=expected,
                    write=False,
                    existing=tmp,
                )

            ing = await anyio.to_thread.run_sync(scan)
            source = {
                "type": "upload",
                "upload_id": upload_id,
                "chunks": row["next_index"],
                "bytes": row["bytes_received"],
            }
            info = await self._contexts._store(
                ing, name=row["name"] or f"upload {upload_id}", format=fmt, source=source, owner=owner
            )
        finally:
            await anyio.Path(tmp).unlink(missing_ok=True)
        async with self._db.transaction() as conn:
            await conn.execute(
                "UPDATE rlm_uploads SET done = true, finalizing = false, context_id = %s, updated_at = %s "
                "WHERE upload_id = %s",
                (info.context_id, time.time(), upload_id),
            )
            await conn.execute("DELETE FROM rlm_upload_chunks WHERE upload_id = %s", (upload_id,))
        log.info("upload %s complete: %s", upload_id, info.context_id)
        return UploadState(
            upload_id=upload_id,
            next_index=row["next_index"],
            bytes_received=row["bytes_received"],
            done=True,
            context=info,
        )

    async def _state(self, row: dict[str, Any], owner: Owner) -> UploadState:
        context = await self._contexts.get(row["context_id"], owner=owner) if row["done"] else None
        return UploadState(
            upload_id=row["upload_id"],
            next_index=row["next_index"],
            bytes_received=row["bytes_received"],
            done=bool(row["done"]),
            context=context,
        )
