"""Chunked, resumable uploads (rlm_upload_context).

State lives in the shared SQLite index (table `uploads`) and chunk files under
`data_dir/uploads/<upload_id>/<index>.part`, so an upload survives a server restart and may
continue on another server process sharing the data dir. The protocol:

* index 0 without upload_id starts an upload; the reply carries the issued upload_id;
* each later chunk carries upload_id and the next index; resending the last stored index with
  identical bytes is a no-op (a client retrying after a lost reply), any other index is an
  error naming the expected one;
* the chunk with final=True completes it: the chunks are streamed into the context store,
  checked against sha256 when given (on mismatch the upload stays, so the caller can resend
  the final chunk with the right digest), and deleted;
* uploads untouched for UPLOAD_TTL_S are removed, finished ones included.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, overload

from pydantic import BaseModel

from rlm_mcp.config import Settings
from rlm_mcp.errors import (
    BadArgumentError,
    UnknownIdError,
    chunk_too_large,
    context_too_large,
    uploads_over_store_cap,
)
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.store import _db
from rlm_mcp.store.context_model import ContextInfo
from rlm_mcp.store.contexts import ContextStore
from rlm_mcp.store.owner_caps import check_pending_uploads, may_continue_upload

log = logging.getLogger("rlm_mcp.store")

MAX_CHUNK_BYTES = 1 << 20
UPLOAD_TTL_S = 24 * 3600
_UPLOAD_ID = re.compile(r"^upl_[0-9a-f]{24}$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class UploadState(BaseModel):
    upload_id: str
    next_index: int
    bytes_received: int
    done: bool
    context: ContextInfo | None = None


def _unknown(upload_id: str) -> UnknownIdError:
    detail = f" (uploads expire {UPLOAD_TTL_S // 3600} h after their last chunk)"
    return UnknownIdError("upload", upload_id, detail=detail)


def check_chunk(data: bytes, index: int, format: str | None, sha256: str | None) -> None:
    """The checks every upload store makes before it looks at its state."""
    if len(data) > MAX_CHUNK_BYTES:
        raise chunk_too_large(index, len(data), MAX_CHUNK_BYTES)
    if index < 0:
        raise BadArgumentError(f"Chunk index {index} is negative.", "Number chunks 0, 1, 2, ...")
    if format not in (None, "text", "json"):
        raise BadArgumentError(f"Unknown format '{format}'.", "Use format='text' or format='json'.")
    if sha256 is not None and not _SHA256.match(sha256.strip()):
        raise BadArgumentError(
            "sha256 must be 64 hexadecimal digits.", "Pass the hex sha256 digest of all the data, or omit it."
        )


class UploadStore:
    def __init__(self, settings: Settings, contexts: ContextStore) -> None:
        self._settings = settings
        self._contexts = contexts
        self._dir = Path(settings.data_dir) / "uploads"

    def _chunk_path(self, upload_id: str, index: int) -> Path:
        return self._dir / upload_id / f"{index:08d}.part"

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
        row = await _db.in_thread(lambda: self._store(data, index, upload_id, name, format, final, owner))
        if row["done"] or not final:
            return await self._state(row, owner)
        try:
            return await self._finalize(row["upload_id"], sha256, owner)
        except BaseException:
            # Not stored (a digest mismatch, a full disk): the caller may resend the final chunk.
            self._finalizing_marker(row["upload_id"]).unlink(missing_ok=True)
            raise

    def _finalizing_marker(self, upload_id: str) -> Path:
        """Present while the final chunk is being stored: appends are refused meanwhile (they
        would be acknowledged and missing from the context). Created and checked only inside
        the index's write transaction, so every server process sharing the data dir agrees."""
        return self._dir / upload_id / "finalizing"

    # --- storing a chunk -----------------------------------------------------------------

    def _store(
        self,
        data: bytes,
        index: int,
        upload_id: str | None,
        name: str | None,
        format: str | None,
        final: bool,
        owner: Owner,
    ) -> sqlite3.Row:
        self._contexts._prepare()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._expire(time.time())
        if upload_id is None:
            if index != 0:
                raise BadArgumentError(
                    f"Chunk {index} came without an upload_id.",
                    "Start an upload with chunk index 0 and no upload_id; send the upload_id of its reply with every later chunk.",
                )
            upload_id = "upl_" + secrets.token_hex(12)
            (self._dir / upload_id).mkdir()
        elif not _UPLOAD_ID.match(upload_id):
            raise _unknown(upload_id)
        chunk_sha = hashlib.sha256(data).hexdigest()
        # Written before the lock is taken, renamed into place under it.
        fd, tmp_name = tempfile.mkstemp(dir=self._dir, prefix=".chunk-", suffix=".tmp")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            with _db.write_txn(self._contexts.db_path) as conn:
                row = self._apply(conn, tmp, data, index, upload_id, chunk_sha, name, format, owner)
                if final and not row["done"]:
                    self._finalizing_marker(upload_id).touch()
        finally:
            tmp.unlink(missing_ok=True)
        return row

    def _apply(
        self,
        conn: sqlite3.Connection,
        tmp: Path,
        data: bytes,
        index: int,
        upload_id: str,
        chunk_sha: str,
        name: str | None,
        format: str | None,
        owner: Owner,
    ) -> sqlite3.Row:
        now = time.time()
        row = _upload_row(conn, upload_id)
        if row is not None and not may_continue_upload(row["owner"], owner):
            raise _unknown(upload_id)  # another owner's: as if it did not exist
        if row is None:
            if index != 0 or not (self._dir / upload_id).is_dir():
                raise _unknown(upload_id)
            self._check_total(len(data))
            self._check_store_room(conn, len(data), owner)
            os.replace(tmp, self._chunk_path(upload_id, 0))
            conn.execute(
                "INSERT INTO uploads (upload_id, next_index, bytes_received, last_chunk_sha, name, format, "
                "created_at, updated_at, done, context_id, owner) VALUES (?, 1, ?, ?, ?, ?, ?, ?, 0, NULL, ?)",
                (upload_id, len(data), chunk_sha, name, format, now, now, owner),
            )
        else:
            expected = row["next_index"]
            resend = index == expected - 1 and chunk_sha == row["last_chunk_sha"]
            if row["done"]:
                if resend:
                    return row
                raise BadArgumentError(
                    f"Upload '{upload_id}' is already complete (context '{row['context_id']}').",
                    "Use that context_id; to store other data start a new upload with index 0 and no upload_id.",
                )
            if index == expected - 1 and not resend:
                raise BadArgumentError(
                    f"Chunk {index} of upload '{upload_id}' was already stored with different bytes.",
                    f"Send the next chunk, index {expected}; to change stored data, start a new upload.",
                )
            if not resend and self._finalizing_marker(upload_id).exists():
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
                self._check_store_room(conn, len(data), owner)
                os.replace(tmp, self._chunk_path(upload_id, index))
                conn.execute(
                    "UPDATE uploads SET next_index = ?, bytes_received = ?, last_chunk_sha = ? WHERE upload_id = ?",
                    (index + 1, row["bytes_received"] + len(data), chunk_sha, upload_id),
                )
            conn.execute(
                "UPDATE uploads SET name = COALESCE(?, name), format = COALESCE(?, format), updated_at = ? "
                "WHERE upload_id = ?",
                (name, format, now, upload_id),
            )
        return _upload_row(conn, upload_id, must_exist=True)

    def _check_total(self, total: int) -> None:
        if total > self._settings.max_context_bytes:
            raise context_too_large(self._settings.max_context_bytes)

    def _check_store_room(self, conn: sqlite3.Connection, adding: int, owner: Owner) -> None:
        """Unfinished uploads count against RLM_MCP_STORE_MAX_BYTES: unlike stored contexts they
        cannot be evicted, so without this they could fill the disk past the cap. The caller's
        own count against its share first (`owner_caps.check_pending_uploads`)."""
        own = conn.execute(
            "SELECT COALESCE(SUM(bytes_received), 0) FROM uploads WHERE done = 0 AND owner = ?", (owner,)
        ).fetchone()[0]
        check_pending_uploads(self._settings, own, adding)
        pending = conn.execute("SELECT COALESCE(SUM(bytes_received), 0) FROM uploads WHERE done = 0").fetchone()[0]
        cap = self._settings.store_max_bytes
        if pending + adding > cap:
            raise uploads_over_store_cap(pending, adding, cap)

    # --- completing ----------------------------------------------------------------------

    async def _finalize(self, upload_id: str, sha256: str | None, owner: Owner) -> UploadState:
        row = await _db.in_thread(lambda: self._row(upload_id))
        count = row["next_index"]

        def chunks() -> Iterator[bytes]:
            for i in range(count):
                yield self._chunk_path(upload_id, i).read_bytes()

        try:
            info = await self._contexts.put_chunks(
                chunks(),
                name=row["name"] or f"upload {upload_id}",
                format=row["format"] or "text",
                source={"type": "upload", "upload_id": upload_id, "chunks": count, "bytes": row["bytes_received"]},
                expected_sha256=sha256.strip().lower() if sha256 else None,
                owner=owner,
            )
        except FileNotFoundError:
            # A concurrent final chunk completed the upload and removed its chunks first.
            row = await _db.in_thread(lambda: self._row(upload_id))
            if row["done"]:
                return await self._state(row, owner)
            raise

        def mark_done() -> sqlite3.Row:
            with _db.write_txn(self._contexts.db_path) as conn:
                conn.execute(
                    "UPDATE uploads SET done = 1, context_id = ?, updated_at = ? WHERE upload_id = ?",
                    (info.context_id, time.time(), upload_id),
                )
                done_row = _upload_row(conn, upload_id, must_exist=True)
            shutil.rmtree(self._dir / upload_id, ignore_errors=True)
            return done_row

        done_row = await _db.in_thread(mark_done)
        log.info("upload %s complete: %s", upload_id, info.context_id)
        return UploadState(
            upload_id=upload_id,
            next_index=done_row["next_index"],
            bytes_received=done_row["bytes_received"],
            done=True,
            context=info,
        )

    def _row(self, upload_id: str) -> sqlite3.Row:
        with _db.connect(self._contexts.db_path) as conn:
            row = _upload_row(conn, upload_id)
        if row is None:
            raise _unknown(upload_id)
        return row

    async def _state(self, row: sqlite3.Row, owner: Owner) -> UploadState:
        context = await self._contexts.get(row["context_id"], owner=owner) if row["done"] else None
        return UploadState(
            upload_id=row["upload_id"],
            next_index=row["next_index"],
            bytes_received=row["bytes_received"],
            done=bool(row["done"]),
            context=context,
        )

    # --- expiry --------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        cutoff = now - UPLOAD_TTL_S
        with _db.write_txn(self._contexts.db_path) as conn:
            stale = [
                r["upload_id"] for r in conn.execute("SELECT upload_id FROM uploads WHERE updated_at < ?", (cutoff,))
            ]
            conn.execute("DELETE FROM uploads WHERE updated_at < ?", (cutoff,))
            known = {r["upload_id"] for r in conn.execute("SELECT upload_id FROM uploads")}
        for upload_id in stale:
            shutil.rmtree(self._dir / upload_id, ignore_errors=True)
        # Folders without a row: a crash between mkdir and the first insert, or a leftover temp.
        for entry in os.scandir(self._dir):
            try:
                if entry.name not in known and now - entry.stat(follow_symlinks=False).st_mtime > UPLOAD_TTL_S:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
            except OSError:
                pass
        if stale:
            log.info("expired %d upload(s)", len(stale))


@overload
def _upload_row(conn: sqlite3.Connection, upload_id: str) -> sqlite3.Row | None: ...


@overload
def _upload_row(conn: sqlite3.Connection, upload_id: str, *, must_exist: Literal[True]) -> sqlite3.Row: ...


def _upload_row(conn: sqlite3.Connection, upload_id: str, *, must_exist: bool = False) -> sqlite3.Row | None:
    """The upload's row; `must_exist` where this transaction has just written it."""
    row: sqlite3.Row | None = conn.execute("SELECT * FROM uploads WHERE upload_id = ?", (upload_id,)).fetchone()
    if must_exist and row is None:
        raise AssertionError(f"upload {upload_id} vanished inside its own transaction")
    return row
