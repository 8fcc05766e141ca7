"""One embedded kept session (`KeptSession`), and the words a follow-up is told when its session
ended (`END_TEXT`, `START_AGAIN`); `sessions.SessionManager` holds them."""

from __future__ import annotations

import logging
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio

from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.owners import Owner
from rlm_mcp.ports.sessions import SessionView
from rlm_mcp.service import session_files
from rlm_mcp.usage import Usage

logger = logging.getLogger("rlm_mcp.service")  # the session manager's logger: one name for its lines

EndReason = Literal["closed", "idle", "expired", "shutdown", "failed", "evicted"]

END_TEXT: dict[EndReason, str] = {
    "closed": "was closed",
    "idle": "ended after RLM_MCP_SESSION_IDLE_S without a run (its sandbox was released and its namespace "
    "could not be saved)",
    "expired": "reached its maximum age (RLM_MCP_SESSION_MAX_AGE_S)",
    "shutdown": "ended when the server stopped",
    "failed": "ended because its first run never started",
    "evicted": "was ended while idle to free its sandbox for another run (all RLM_MCP_MAX_SANDBOXES were in use) "
    "and its namespace could not be saved",
}
START_AGAIN = (
    "Start a new session: call rlm_complete (or rlm_start) with keep_session=true and the context_id(s) to use."
)


@dataclass
class KeptSession:
    """One session: its owner, its runs and contexts, its REPL (`repl`), and its own lock."""

    session_id: str
    owner: Owner
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    run_ids: list[str] = field(default_factory=list)
    context_ids: list[str] = field(default_factory=list)
    repl: SessionSandbox = field(init=False)
    running: str | None = None  # the run now using the REPL
    pins: AsyncExitStack = field(default_factory=AsyncExitStack)
    ended: EndReason | None = None
    usage: Usage = field(default_factory=Usage)  # the session's runs together
    # While its sandbox is being given back (`running` is SAVING): the scope of the snapshot
    # (`close` cancels it), set when the release is over, and whether `close` asked for it.
    saving: anyio.CancelScope | None = None
    saved: anyio.Event | None = None
    closing: bool = False

    def __post_init__(self) -> None:
        self.repl = SessionSandbox(self.session_id)

    def view(self) -> SessionView:
        """The session as `rlm_list_sessions` and its resource show it."""
        return SessionView(
            session_id=self.session_id,
            runs=list(self.run_ids),
            running=self.running,
            context_ids=list(self.context_ids),
            contexts_bound=self.repl.context_count,
            histories=self.repl.history_count,
            context_bytes=sum(spec.bytes for spec in self.repl.contexts),
            sandbox_live=self.repl.live,
            snapshot_bytes=self.repl.snapshot.size if self.repl.snapshot is not None else None,
            snapshot_error=self.repl.snapshot_error,
            usage=self.usage.to_dict(),
            created_at=self.created_at,
            age_s=round(time.monotonic() - self.started, 3),
            idle_s=0.0 if self.running else round(time.monotonic() - self.last_used, 3),
        )

    async def let_go(self, data_dir: Path) -> None:
        """Give back what the session holds: its sandbox, its snapshot file (never stored with a
        record: no other process takes it) and its contexts' pins. Shielded: each is released
        even while the caller is cancelled, and a failure of one does not keep the others."""
        with anyio.CancelScope(shield=True):
            try:
                await self.repl.release()
            except Exception:
                logger.exception("releasing the sandbox of session %s failed", self.session_id)
            try:
                await anyio.to_thread.run_sync(session_files.discard, data_dir, self.session_id)
            except OSError:
                logger.exception("removing the snapshot of session %s failed", self.session_id)
            try:
                await self.pins.aclose()
            except Exception:
                logger.exception("unpinning the contexts of session %s failed", self.session_id)
