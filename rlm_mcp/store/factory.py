"""Which store this process uses: SQLite and files (embedded) or PostgreSQL (team mode).

Each builds the bundle without any I/O; `async with stores:` opens what it needs (PostgreSQL:
the connection pool, the schema migrations, this replica's heartbeat) and closes it again. The
embedded store has nothing to open. The assembly (rlm_mcp/assembly/) calls the one its role
needs; `make_stores` is for the operator's one-off commands, which follow the deployment.
"""

from __future__ import annotations

from rlm_mcp.config import BlobSettings, Settings, StoreSettings, TeamSettings
from rlm_mcp.errors import TEAM_EXTRA_FIX, RlmMcpError
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.runs import RunStore
from rlm_mcp.store.sqlite_index import ContextStore
from rlm_mcp.store.sqlite_uploads import UploadStore

__all__ = ["Stores", "embedded_stores", "make_stores", "team_stores"]


def embedded_stores(store: StoreSettings) -> Stores:
    """SQLite and files under RLM_MCP_DATA_DIR."""
    contexts = ContextStore(store)
    return Stores(contexts=contexts, uploads=UploadStore(store, contexts), runs=RunStore(store))


def team_stores(
    store: StoreSettings, team: TeamSettings, *, replica: bool, blobs: BlobSettings | None = None
) -> Stores:
    """Shared state on the PostgreSQL database `team` names. `replica`: this process serves clients (it is recorded as a
    replica and sweeps its local cache); the CLI's one-off commands pass False."""
    try:
        from rlm_mcp.store.pg import make_pg_stores
    except ImportError as exc:
        raise RlmMcpError(
            f"RLM_MCP_DATABASE_URL is set but the PostgreSQL driver is not installed ({exc.name}).",
            f"Install the team extra. {TEAM_EXTRA_FIX} Or unset RLM_MCP_DATABASE_URL.",
        ) from None
    return make_pg_stores(store, team, replica=replica, blobs=blobs)


def make_stores(settings: Settings, *, replica: bool = False) -> Stores:
    """The stores of this deployment (`settings.deployment`)."""
    if settings.deployment.embedded:
        return embedded_stores(settings.store)
    return team_stores(settings.store, settings.team, replica=replica, blobs=settings.blobs)
