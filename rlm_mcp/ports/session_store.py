"""Team mode's kept sessions as the database holds them: the `SessionStorePort` that the team
session backend (`service.team_sessions`) and a worker's held sessions (`service.queue.sessions`)
are written against, and the `SessionRow` it answers with. PostgreSQL implements it
(`store.pg.sessions.PgSessionStore`); the assembly hands it down, so the service names no
concrete store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = ["AfterRun", "SessionRow", "SessionStorePort"]


@dataclass(frozen=True)
class SessionRow:
    """A session as the database holds it (the snapshot's bytes apart)."""

    session_id: str
    owner: str
    state: str  # open, closed or expired
    created_at: float  # Unix seconds
    age_s: float
    idle_s: float
    running_run: str | None  # the run that took it last (see `free`)
    free: bool  # no run holds it: `running_run` ended (or never reached the queue)
    run_ids: list[str]
    context_ids: list[str]  # bound as context_0, context_1, ... in order
    histories: list[list[dict[str, str]]]
    usage: dict[str, Any]
    generation: int  # runs whose end is recorded
    worker_id: int | None  # the worker holding its live sandbox
    snapshot_gen: int | None  # the generation its snapshot was taken after
    snapshot_bytes: int | None
    snapshot_error: str | None


@dataclass(frozen=True)
class AfterRun:
    """The session as its run left it, which `SessionStorePort.finish_run` records: one value for
    the port, the store and their callers rather than five keywords spelled out in each."""

    worker_id: int | None  # the worker holding its sandbox now (None: none, the REPL is gone)
    began: bool  # the run began: the session moves one generation on (and its snapshot error clears)
    context_ids: list[str] = field(default_factory=list)
    histories: list[list[dict[str, str]]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)


class SessionStorePort(Protocol):
    """Every statement on team-mode kept sessions, as the service uses them."""

    # --- fronts
    async def open(self, session_id: str, owner: str, run_id: str, *, cap: int, max_age_s: float) -> None: ...
    async def claim(self, session_id: str, owner: str, run_id: str, *, max_age_s: float) -> SessionRow | None: ...
    async def unclaim(self, session_id: str, run_id: str) -> None: ...
    async def read(self, session_id: str) -> SessionRow | None: ...
    async def list_open(self, owner: str | None, *, max_age_s: float) -> list[SessionRow]: ...
    async def close(self, session_id: str) -> bool: ...

    # --- workers
    async def finish_run(self, session_id: str, run_id: str, after: AfterRun) -> int | None: ...
    async def save_snapshot(
        self, session_id: str, generation: int, blob: bytes | Path, *, owner_cap: int
    ) -> str | None: ...
    async def snapshot_failed(self, session_id: str, generation: int, why: str) -> None: ...
    async def read_snapshot_into(self, session_id: str, path: Path) -> tuple[int, int] | None: ...
    async def holders(self, session_ids: list[str]) -> dict[str, tuple[str, int | None, int]]: ...
    async def let_go(self, session_id: str, worker_id: int) -> None: ...
    async def expire(self, *, max_age_s: float) -> int: ...
