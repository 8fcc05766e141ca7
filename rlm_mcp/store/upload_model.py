"""What an upload is, in every store: its state as the caller sees it (`UploadState`), its id,
how big a chunk may be, how long an untouched upload lives, and the checks a chunk meets before
any store looks at it.
"""

from __future__ import annotations

import re
import secrets

from pydantic import BaseModel

from rlm_mcp.errors import BadArgumentError, UnknownIdError, chunk_too_large
from rlm_mcp.store.context_model import ContextInfo

__all__ = [
    "MAX_CHUNK_BYTES",
    "UPLOAD_ID",
    "UPLOAD_TTL_S",
    "UploadState",
    "check_chunk",
    "new_upload_id",
    "unknown_upload",
]

MAX_CHUNK_BYTES = 1 << 20
UPLOAD_TTL_S = 24 * 3600
UPLOAD_ID = re.compile(r"^upl_[0-9a-f]{24}$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class UploadState(BaseModel):
    upload_id: str
    next_index: int
    bytes_received: int
    done: bool
    context: ContextInfo | None = None


def new_upload_id() -> str:
    return "upl_" + secrets.token_hex(12)


def unknown_upload(upload_id: str) -> UnknownIdError:
    detail = f" (uploads expire {UPLOAD_TTL_S // 3600} h after their last chunk)"
    return UnknownIdError("upload", upload_id, detail=detail)


def check_chunk(data: bytes, index: int, format: str | None, sha256: str | None) -> None:
    """The checks a chunk meets before its upload's state is looked at."""
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
