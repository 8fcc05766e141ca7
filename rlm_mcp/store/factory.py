"""Which store this process uses: SQLite and files (default) or PostgreSQL (team mode).

`make_stores(settings)` builds the bundle without any I/O; `async with stores:` opens what it
needs (PostgreSQL: the connection pool, the schema migrations, this replica's heartbeat) and
closes it again. The embedded default has nothing to open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from rlm_mcp.config import Settings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.store.contexts import ContextStore
from rlm_mcp.store.ports import ContextStorePort, RunStorePort, UploadStorePort
from rlm_mcp.store.runs import RunStore
from rlm_mcp.store.uploads import UploadStore


class Lifecycle(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def shared_key(self, name: str) -> bytes | None:
        """A random key every process sharing this store sees (None: one process only)."""
        ...


class _Nothing:
    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def shared_key(self, name: str) -> bytes | None:
        return None


@dataclass
class Stores:
    contexts: ContextStorePort
    uploads: UploadStorePort
    runs: RunStorePort
    kind: str = "sqlite"
    lifecycle: Lifecycle = field(default_factory=_Nothing)
    # Run once the store is open (the HTTP viewer fetches its shared key here).
    after_open: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def __aenter__(self) -> Stores:
        await self.lifecycle.open()
        try:
            for hook in self.after_open:
                await hook()
        except BaseException:
            await self.lifecycle.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.lifecycle.close()


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
            "Install the team extra: pip install 'rlm-mcp[team]' (or unset RLM_MCP_DATABASE_URL).",
        ) from None
    return make_pg_stores(settings, replica=replica)
