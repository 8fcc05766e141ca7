"""The bundle of stores one process uses (`Stores`), whichever implementation it holds.

`async with stores:` opens what the implementation needs and closes it again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, Self

from rlm_mcp.ports.webhooks import WebhookOutboxPort
from rlm_mcp.store.ports import ContextStorePort, RunStorePort, UploadStorePort
from rlm_mcp.store.spent_codes import LocalSpentCodes, SpentCodesPort


class Lifecycle(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def shared_key(self, name: str) -> bytes | None:
        """A random key every process sharing this store sees (None: one process only)."""
        ...

    async def ping(self) -> bool | None:
        """Whether a shared database answers now (None: there is none; the health route)."""
        ...

    def fault(self) -> str | None:
        """What a shared database recently refused statements for ("disk full", "out of
        memory"), else None (the health route)."""
        ...


class _Nothing:
    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def shared_key(self, name: str) -> bytes | None:
        return None

    async def ping(self) -> bool | None:
        return None

    def fault(self) -> str | None:
        return None


@dataclass
class Stores:
    contexts: ContextStorePort
    uploads: UploadStorePort
    runs: RunStorePort
    kind: str = "sqlite"
    lifecycle: Lifecycle = field(default_factory=_Nothing)
    # The viewer's one-time login codes: spent once in this process, or once on every replica.
    spent_codes: SpentCodesPort = field(default_factory=LocalSpentCodes)
    # Run ends' callbacks, kept until delivered (None: a store without an outbox, in tests).
    webhooks: WebhookOutboxPort | None = None
    # What the bucket of RLM_MCP_BLOB_URL last failed with, recently ("unreachable", "refused",
    # "full"), else None; itself None without a bucket (the health route).
    blob_fault: Callable[[], str | None] | None = None
    # Run once the store is open (the HTTP viewer fetches its shared key here).
    after_open: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def __aenter__(self) -> Self:
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
