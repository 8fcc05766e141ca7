"""Which store this process uses: SQLite and files (embedded) or PostgreSQL (team mode).

Each builds the bundle without any I/O; `async with stores:` opens what it needs (PostgreSQL:
the connection pool, the schema migrations, this replica's heartbeat) and closes it again. The
embedded store has nothing to open. The assembly (rlm_mcp/assembly/) calls the one its role
needs (`rlm_mcp.assembly.make_stores` follows the deployment, for the one-off commands).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlm_mcp.config import BlobSettings, StoreSettings, TeamDatabase
from rlm_mcp.errors import TEAM_EXTRA_FIX, RlmMcpError
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.runs import RunStore
from rlm_mcp.store.sqlite_index import ContextStore
from rlm_mcp.store.sqlite_uploads import UploadStore
from rlm_mcp.store.webhooks import SqliteWebhookOutbox

if TYPE_CHECKING:
    from rlm_mcp.store.pg import PgStores  # team mode only: it needs the team extra

__all__ = ["Stores", "embedded_stores", "team_stores"]


def embedded_stores(store: StoreSettings) -> Stores:
    """SQLite and files under RLM_MCP_DATA_DIR."""
    contexts = ContextStore(store)
    return Stores(
        contexts=contexts,
        uploads=UploadStore(store, contexts),
        runs=RunStore(store),
        webhooks=SqliteWebhookOutbox(store.data_dir),
    )


def team_stores(
    store: StoreSettings, team: TeamDatabase, *, replica: bool, blobs: BlobSettings | None = None, warm: int = 1
) -> PgStores:
    """Shared state on the PostgreSQL database `team` names. `replica`: this process serves clients (it is recorded as a
    replica and sweeps its local cache); the CLI's one-off commands pass False. `warm`: pooled
    connections kept open from the start (`make_pg_stores`)."""
    try:
        from rlm_mcp.store.pg import make_pg_stores
    except ImportError as exc:
        raise RlmMcpError(
            f"RLM_MCP_DATABASE_URL is set but the PostgreSQL driver is not installed ({exc.name}).",
            f"Install the team extra. {TEAM_EXTRA_FIX} Or unset RLM_MCP_DATABASE_URL.",
        ) from None
    return make_pg_stores(store, team, replica=replica, blobs=blobs, warm=warm)
