"""The contexts a run's start names, as its admission reads them (`Caller.start_run`: the
sandbox check, and the unknown-context error).

Where runs execute in this process, each start reads them from the store, as the run uses them.
A team front (`RunBackend.local` false) remembers what it read, per owner and id
(`KnownContexts`): what the admission uses of a context (its format, bytes and chars) never
changes for an id, which its content names, and the enqueue checks in its own statement that the
owner still holds every context the run names (`RunQueuePort.enqueue`), refusing the
start with the same unknown-context error when one is gone. So a front sends no read for the
contexts its owners started runs on before, and a context another owner holds is never
admitted: an entry is made only from the owner's own read, and the enqueue checks the owner's.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlm_mcp.lru import LruMap
from rlm_mcp.owners import Owner
from rlm_mcp.store import ContextInfo
from rlm_mcp.store.ports import ContextStorePort

__all__ = ["KnownContexts"]

KNOWN_CONTEXTS_KEPT = 4096  # entries; the least recently used go first


class KnownContexts:
    """A team front's remembered contexts, by owner and id (the module's rule)."""

    def __init__(self, contexts: ContextStorePort, *, kept: int = KNOWN_CONTEXTS_KEPT) -> None:
        self._contexts = contexts
        self._known: LruMap[tuple[str, str], ContextInfo] = LruMap(kept)

    async def get(self, ids: Sequence[str], *, owner: Owner) -> list[ContextInfo]:
        """Each context as `owner` last read it here, else read now (the unknown-context error
        when the owner holds none by that id: nothing is remembered for it)."""
        infos = []
        for cid in ids:
            key = (str(owner), cid)
            info = self._known.use(key)
            if info is None:
                info = await self._contexts.get(cid, owner=owner)
                self._known.put(key, info)
            infos.append(info)
        return infos
