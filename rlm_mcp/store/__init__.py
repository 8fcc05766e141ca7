"""The store layer: contexts (content-addressed, per owner), chunked uploads, run records.

The service uses it through the store ports (`store.ports`). Every rule of contexts and uploads
is written once (`store.contexts`, `store.uploads`) over an index that SQLite and files in the
data dir (`store.sqlite_index`, `store.sqlite_uploads`; the default) or PostgreSQL (`store.pg`,
team mode) implement; `store.factory` builds either (the assembly picks one from the settings).
Owns files on disk, the shared index (WAL, busy timeout), limits, eviction and pruning. Run
events are stored through their one encoding (`rlm_mcp.events.to_json`/`from_json`).
Must not know about MCP, the CLI, the engine or sandboxes (it shares only `rlm_mcp.ports`
with them; docs/architecture.md): its errors state what is wrong (an unknown id, a size over
a cap) and the layers above say how their user fixes it.
"""

from rlm_mcp.store.context_model import ContextInfo, context_id_for
from rlm_mcp.store.runs import RunLog, RunStore, check_run_id
from rlm_mcp.store.sqlite_index import ContextStore
from rlm_mcp.store.sqlite_uploads import UploadStore
from rlm_mcp.store.upload_model import MAX_CHUNK_BYTES, UploadState

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
