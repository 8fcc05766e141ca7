"""Kept sessions as the service sees them, in either mode: the `SessionBackend` port.

Beside the run backend (`service.backends.RunBackend`), the assembly (rlm_mcp/assembly/) gives
the service one session backend for its role: the embedded one (`service.sessions.SessionManager`:
REPLs held in this process, stored in the data dir at shutdown) or the team one
(`service.team_sessions.TeamSessions`: every session's state in the database, its live sandbox on
whichever worker ran it last). The service and `Caller` talk to the port only and never ask which
one they hold.

A session runs one question at a time: `start` claims it for the run with the same check that
`close` and the expiry make (a follow-up racing them either runs, the session then refusing to
end until the run is over, or is refused because the session ended; never a run in an ended
session).

The run and engine types are parameters (`RunT`, `EngineT`): the port sits below the service and
the engine and names neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict

from rlm_mcp.owners import OwnerScope
from rlm_mcp.ports.engine import ContextSpec
from rlm_mcp.ports.runs import RunRequest

SAVING = "(saving)"  # `running` while an idle embedded session's namespace is snapshotted

SessionState = Literal["running", "saving", "live", "stored"]

RunT = TypeVar("RunT", covariant=True)
EngineT = TypeVar("EngineT", contravariant=True)


class SessionView(BaseModel):
    """A session as `rlm_list_sessions`, `rlm://sessions/{id}`, `rlm_close_session` and the CLI
    show it. Each backend sets the fields it knows; `to_dict` gives exactly those, in this order
    (a field set to None is shown as null, one left unset is not shown)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    runs: list[str] = []
    running: str | None = None  # the run using the REPL now (embedded: SAVING while it is saved)
    context_ids: list[str] = []
    contexts_bound: int = 0
    histories: int = 0
    context_bytes: int = 0  # embedded: the bound contexts' size
    sandbox_live: bool = False
    worker_id: int | None = None  # team: the worker holding its live sandbox
    stored: bool = False  # embedded: kept in the data dir by a stopped process
    snapshot_bytes: int | None = None
    snapshot_runs: int | None = None  # team: the runs the stored snapshot covers
    snapshot_error: str | None = None
    usage: dict[str, Any] | None = None
    created_at: float | None = None
    age_s: float | None = None
    idle_s: float | None = None

    def to_dict(self) -> dict[str, object]:
        return self.model_dump(exclude_unset=True)

    @property
    def state(self) -> SessionState:
        """What the viewer shows beside the session's runs."""
        if self.stored:
            return "stored"
        if self.running == SAVING:
            return "saving"
        return "running" if self.running else "live"


@dataclass(frozen=True)
class FollowUp:
    """An open session a follow-up may continue, as `SessionBackend.find` saw it."""

    session_id: str
    # The contexts its REPL already holds (embedded): this run's must fit in the sandbox beside them.
    bound: Sequence[ContextSpec] = ()


class SessionBackend(Protocol[RunT, EngineT]):
    """Open, continue, list, describe and close kept sessions; enter it in the service's stack."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def find(self, session_id: str, *, owner: OwnerScope) -> FollowUp:
        """The open session, free for a follow-up: NotFoundError saying why not (unknown, another
        owner's, ended and why), BusyError naming the run to wait for."""
        ...

    async def check_can_keep(self) -> None:
        """Refuse (RlmMcpError with the fix) when this process cannot keep a session's REPL."""
        ...

    async def start(self, request: RunRequest, engine: EngineT | None) -> RunT:
        """Start a run in its session: `request.session_id` None opens a new one (refused past
        RLM_MCP_MAX_SESSIONS_PER_OWNER), else the run continues that one, claimed at once (an
        ended or busy session is refused, and nothing is opened for it)."""
        ...

    async def list(self, *, owner: OwnerScope) -> list[SessionView]: ...

    async def describe(self, session_id: str, *, owner: OwnerScope) -> SessionView: ...

    async def close(self, session_id: str, *, owner: OwnerScope) -> SessionView:
        """End the session and release its sandbox; BusyError while one of its runs is going."""
        ...

    def why_ended(self, session_id: str) -> str | None:
        """Why a session this process held ended (None: it did not, or this process cannot say)."""
        ...

    async def reclaim(self) -> bool:
        """The sandboxes' hook: a sandbox must open and no slot is free, so the least recently
        used idle session gives its sandbox back. False when no session here is idle."""
        ...
