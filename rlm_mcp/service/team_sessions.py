"""Kept sessions in team mode, as any replica's front sees them: all of their state is in the
database (`store.pg.sessions`), so every replica lists, shows, continues and closes them alike.

A run with `keep_session` opens a session (refused past RLM_MCP_MAX_SESSIONS_PER_OWNER, counted
in the database); a follow-up takes the session with one conditional update, so of two follow-ups
sent together, on any replicas, one runs and the other is refused with a BusyError naming the run
to wait for (rlm_result), as in embedded mode. The follow-up is queued preferring the worker that
holds the session's live sandbox (`queue.sessions.WorkerSessions` runs it there, or restores it
on another worker). A session is its owner's alone: another token gets "unknown session".

`TeamSessions` is the team implementation of the session port (`ports/sessions.py`). The claim
is the database's: `close` and the expiry end only a session whose run is over, and a follow-up's
claim takes only an open, unexpired, free session, so an ended session never gets a run. In a
process that executes runs it also answers the sandboxes' `reclaim` for the sessions whose
sandboxes this worker holds (`queue.sessions.WorkerSessions`, which the worker enters).
"""

from __future__ import annotations

import secrets
from typing import Self

import anyio

from rlm_mcp.config import SessionSettings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import BusyError, NotFoundError, RlmMcpError
from rlm_mcp.owners import OwnerScope, sees
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.ports.session_store import SessionRow, SessionStorePort
from rlm_mcp.ports.sessions import FollowUp, SessionView
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.kept import START_AGAIN
from rlm_mcp.service.queue.front import QueueFront, new_run_id
from rlm_mcp.service.queue.sessions import WorkerSessions
from rlm_mcp.usage import Usage


def view(row: SessionRow) -> SessionView:
    """A session as `rlm_list_sessions` and its resource show it."""
    running = None if row.free else row.running_run
    return SessionView(
        session_id=row.session_id,
        runs=list(row.run_ids),
        running=running,
        context_ids=list(dict.fromkeys(row.context_ids)),
        contexts_bound=len(row.context_ids),
        histories=len(row.histories),
        sandbox_live=row.worker_id is not None,
        worker_id=row.worker_id,
        snapshot_bytes=row.snapshot_bytes,
        snapshot_runs=row.snapshot_gen,
        snapshot_error=row.snapshot_error,
        usage=Usage.of(row.usage).to_dict(),  # the shape embedded mode shows, empty before a run ends
        created_at=row.created_at,
        age_s=round(row.age_s, 3),
        idle_s=0.0 if running else round(row.idle_s, 3),
    )


class TeamSessions:
    """Open, continue, list and close team-mode sessions (the front's side); `worker`: the
    sessions whose sandboxes this process holds, where it executes runs."""

    def __init__(
        self, settings: SessionSettings, store: SessionStorePort, worker: WorkerSessions | None = None
    ) -> None:
        self._settings = settings
        self.store = store
        self._worker = worker
        self._front: QueueFront | None = None

    def queue_through(self, front: QueueFront) -> None:
        """The queue front that runs go through (opened with the service, after this is built)."""
        self._front = front

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None  # the worker's sessions are the worker's to close (their sandboxes go with it)

    async def find(self, session_id: str, *, owner: OwnerScope) -> FollowUp:
        await self._row(session_id, owner=owner, free=True)  # unknown, ended or busy: said first
        return FollowUp(session_id)

    async def check_can_keep(self) -> None:
        return None  # a worker checks its own image before it runs a session's run

    def why_ended(self, session_id: str) -> str | None:
        return None  # a follow-up reads why from the database (`find`)

    async def reclaim(self) -> bool:
        return await self._worker.reclaim() if self._worker is not None else False

    async def _row(self, session_id: str, *, owner: OwnerScope, free: bool = False) -> SessionRow:
        """The open session; a tool error that says why otherwise ("unknown" for another owner's).
        `free`: also refuse (BusyError) while one of its runs is going."""
        row = await self.store.read(session_id)
        if row is None or not sees(owner, row.owner):
            raise NotFoundError(f"Unknown session id '{session_id}'.", START_AGAIN)
        if row.state == "closed":
            raise NotFoundError(f"Session {session_id} was closed.", START_AGAIN)
        if row.state == "expired" or row.age_s >= self._settings.session_max_age_s:
            raise NotFoundError(
                f"Session {session_id} reached its maximum age (RLM_MCP_SESSION_MAX_AGE_S).", START_AGAIN
            )
        if free and not row.free:
            raise BusyError(
                f"Session {session_id} is still answering run {row.running_run}; a session runs one question at a time.",
                f"Wait for it (rlm_result with run_id={row.running_run} and wait_s), then ask again.",
            )
        return row

    async def start(self, request: RunRequest, engine: RLMEngine | None) -> ActiveRun:
        """Queue a run in its session (a new one when `request.session_id` is None)."""
        front = self._front
        if front is None:
            raise RuntimeError("TeamSessions used before the service opened its queue")
        settings, owner = self._settings, str(request.owner)
        run_id = new_run_id()
        session_id, prefer = request.session_id, None
        if session_id is None:
            session_id = f"ses_{secrets.token_hex(10)}"
            await self.store.open(
                session_id,
                owner,
                run_id,
                cap=settings.max_sessions_per_owner,
                max_age_s=settings.session_max_age_s,
            )
            request = request.model_copy(update={"session_id": session_id})
            new = True
        else:
            row = await self.store.claim(session_id, owner, run_id, max_age_s=settings.session_max_age_s)
            if row is None:  # taken by another follow-up, or ended, since it was looked at
                await self._row(session_id, owner=request.owner, free=True)
                raise BusyError(f"Session {session_id} is busy.", "Ask again in a moment.")
            prefer, new = row.worker_id, False
        try:
            return await front.start(
                request, None, run_id=run_id, prefer_worker=prefer, prefer_s=settings.session_prefer_worker_s
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.store.unclaim(session_id, run_id)
                if new:
                    await self.store.close(session_id)
            raise

    async def list(self, *, owner: OwnerScope) -> list[SessionView]:
        scope = owner if isinstance(owner, str) else None
        rows = await self.store.list_open(scope, max_age_s=self._settings.session_max_age_s)
        return [view(row) for row in rows if sees(owner, row.owner)]

    async def describe(self, session_id: str, *, owner: OwnerScope) -> SessionView:
        return view(await self._row(session_id, owner=owner))

    async def close(self, session_id: str, *, owner: OwnerScope) -> SessionView:
        row = await self._row(session_id, owner=owner)
        if not row.free or not await self.store.close(session_id):
            fresh = await self.store.read(session_id)
            running = fresh.running_run if fresh is not None else row.running_run
            raise BusyError(
                f"Session {session_id} is answering run {running}.",
                f"Cancel it first (rlm_cancel with run_id={running}) or wait for it to end.",
            )
        closed = await self.store.read(session_id)
        if closed is None:
            raise RlmMcpError(f"Session {session_id} vanished while it was closed.")
        return view(closed)
