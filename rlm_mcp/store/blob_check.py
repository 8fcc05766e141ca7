"""A stored context's bytes must still be what the index says.

Blobs are files in the data dir: something outside rlm-mcp (a person, a disk tool, a restore)
can change one. A run then told the model "300,000 characters" and sent 1,000. The size is
checked when a run pins its contexts (a cheap stat; hashing every run would read every byte);
any store (SQLite or another) calls `check_blob` before handing a blob to a run.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlm_mcp.errors import RlmMcpError

__all__ = ["BlobChangedError", "check_blob"]


class BlobChangedError(RlmMcpError):
    """A stored context's file no longer has the size the index recorded."""


def check_blob(path: Path, expected_bytes: int, context_id: str) -> bool:
    """False when the blob is gone (the caller answers "unknown id"); raise when its size
    differs from the index; True when it is intact by size."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return False
    if size != expected_bytes:
        raise BlobChangedError(
            f"The stored bytes of context '{context_id}' changed on disk (the index says {expected_bytes} bytes, "
            f"the file {path} holds {size}).",
            "Delete the context (rlm_delete_context) and load it again.",
        )
    return True
