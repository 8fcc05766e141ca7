"""Store layer: contexts (content-addressed, SQLite index), chunked uploads, run records.

Knows nothing about MCP; every error it raises is an `rlm_mcp.errors` error whose text can be
shown to a user as is.
"""

from rlm_mcp.store.contexts import ContextInfo, ContextStore, context_id_for
from rlm_mcp.store.runs import RunLog, RunStore, check_run_id
from rlm_mcp.store.uploads import MAX_CHUNK_BYTES, UploadState, UploadStore

__all__ = [
    "MAX_CHUNK_BYTES",
    "ContextInfo",
    "ContextStore",
    "RunLog",
    "RunStore",
    "UploadState",
    "UploadStore",
    "check_run_id",
    "context_id_for",
]
