"""Where runs execute, as `RlmService` sees it: a `RunBackend`, the local `RunManager` or the
team-mode queue, chosen by the assembly (rlm_mcp/assembly/) for this process's role.

`RlmService` talks to a `RunBackend` and never asks which one it holds. The embedded default
(no RLM_MCP_DATABASE_URL) runs everything in this process; team mode goes through the run queue
on PostgreSQL (`service.queue`), whatever the role, so any replica's worker may take a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import OwnerScope
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.service.active_run import ActiveRun


class RunBackend(Protocol):
    # True: runs execute in this process (starting one needs the engine and a ready sandbox backend).
    local: bool

    def get(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """A run this process already follows; None otherwise (or another owner's)."""
        ...

    async def find(self, run_id: str, *, owner: OwnerScope) -> ActiveRun | None:
        """The live run, wherever it executes; None when unknown, another owner's or ended."""
        ...

    async def start(
        self, request: RunRequest, engine: RLMEngine | None, *, contexts: Sequence[ContextSpec] | None = None
    ) -> ActiveRun:
        """`contexts`: the request's contexts as the call's admission read them (a backend may
        use them instead of reading them again)."""
        ...

    async def let_go(self, context_id: str, *, owner: OwnerScope) -> bool:
        """Wait a moment for runs of this process that have ended but still pin `context_id` to
        let it go; whether there were any (a deletion refused because of them is tried again)."""
        ...

    async def cancel(self, run_id: str, *, wait_s: float = 5.0) -> None: ...

    async def follow_progress(self, run_id: str) -> None:
        """Say that something here follows the run's progress turn by turn (a caller with a
        progress token, an event stream, the viewer's live page): every such place says it
        through this one call. A hint for latency only (team mode: the worker publishes the run's
        live summary at the live-summary interval rather than the unfollowed one); nothing for a
        run this process executes itself."""
        ...
