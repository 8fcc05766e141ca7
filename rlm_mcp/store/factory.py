"""Which store this process uses: SQLite and files (default) or PostgreSQL (team mode).

`make_stores(settings)` builds the bundle without any I/O; `async with stores:` opens what it
needs (PostgreSQL: the connection pool, the schema migrations, this replica's heartbeat) and
closes it again. The embedded default has nothing to open.
"""

from __future__ import annotations

from rlm_mcp.config import Settings
from rlm_mcp.errors import TEAM_EXTRA_FIX, RlmMcpError
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.runs import RunStore
from rlm_mcp.store.sqlite_index import ContextStore
from rlm_mcp.store.sqlite_uploads import UploadStore

__all__ = ["Stores", "make_stores"]


def make_stores(settings: Settings, *, replica: bool = False) -> Stores:
    """The stores `settings` select. `replica`: this process serves clients (team mode records
    it as a replica and sweeps its local cache); the CLI's one-off commands pass False."""
    if settings.database_url is None:
        contexts = ContextStore(settings)
        return Stores(contexts=contexts, uploads=UploadStore(settings, contexts), runs=RunStore(settings))
    try:
        from rlm_mcp.store.pg import make_pg_stores
    except ImportError as exc:
        raise RlmMcpError(
            f"RLM_MCP_DATABASE_URL is set but the PostgreSQL driver is not installed ({exc.name}).",
            f"Install the team extra. {TEAM_EXTRA_FIX} Or unset RLM_MCP_DATABASE_URL.",
        ) from None
    return make_pg_stores(settings, replica=replica)
