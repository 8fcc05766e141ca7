"""Kept sessions: follow-up questions that continue in the same REPL (docs/sessions.md).

A run started with `keep_session` opens a session; a later run that names its `session_id`
continues it: the session's live sandbox is reused (engine/session.py binds the new contexts as
the next `context_i` and the earlier conversations as `history_i`). A session is its owner's
alone (another owner gets "unknown session"), runs one question at a time (a second one while a
run is going is refused, not queued: the caller waits for the first with rlm_result), pins its
contexts against eviction, and ends on `rlm_close_session`, RLM_MCP_SESSION_MAX_AGE_S after it
started, or at shutdown. Its sandbox is released after RLM_MCP_SESSION_IDLE_S without a run, or
when a run needs a sandbox slot that only idle sessions hold (least recently used first): a
session with a snapshot of its namespace (engine/snapshot.py) lives on and its next run restores
it in a fresh sandbox; one whose namespace cannot be saved (no dill in the image, too big) ends.
The snapshot is taken when the sandbox is given back, not after every run: serializing a big
namespace costs seconds that no follow-up should wait for (bench/sessions.py). It is taken in a
task of this manager, never in the task of the run that needs the slot (that run waits only for
the slot, as long as its own deadline allows), within `snapshot_deadline_s`, and straight into
the session's file in the data dir (service/session_shelf.py). `rlm_close_session` ends a session
whose snapshot is under way.
An ended session is remembered (briefly, bounded) so that a follow-up says why it cannot go on.

`SessionManager` is the embedded implementation of the session port (`ports/sessions.py`): a
follow-up claims its session in `start` with no await between the look-up and the claim, and
`close` and the sweep end only a session no run has claimed, so an ended session never gets a run
(nor a sandbox nobody would release).
"""

from __future__ import annotations

import builtins
import logging
import secrets
import time

import anyio

from rlm_mcp.config import KeptSessionSettings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.engine.snapshot import Snapshot
from rlm_mcp.errors import BusyError, NotFoundError
from rlm_mcp.lru import LruMap
from rlm_mcp.observability import metrics
from rlm_mcp.owners import Owner, OwnerScope, sees
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.ports.sessions import SAVING, FollowUp, SessionView
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service import session_files, session_shelf
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.kept import END_TEXT, START_AGAIN, EndReason, KeptSession
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.ports import ContextStorePort
from rlm_mcp.ticks import sleep_to_tick
from rlm_mcp.usage import Usage

logger = logging.getLogger("rlm_mcp.service")

STARTING = "starting"  # `running` while a run is being started in the session (`start`)
ENDED_KEPT = 256  # ended sessions remembered, to say why a follow-up cannot continue
SWEEP_EVERY_S = 5.0


class SessionManager:
    """Owns every kept session of this process; enter it in the service's exit stack (after the
    runs: it is closed first, and a session's REPL goes back to the sandboxes it came from)."""

    def __init__(
        self, settings: KeptSessionSettings, contexts: ContextStorePort, sandboxes: SandboxManager, runs: RunManager
    ) -> None:
        self._settings = settings
        self._contexts = contexts
        self._sandboxes = sandboxes
        self._runs = runs
        self._live: dict[str, KeptSession] = {}
        self._ended: LruMap[str, tuple[Owner, str]] = LruMap(ENDED_KEPT)  # owner, why (said to a follow-up)
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> SessionManager:
        metrics.watch_sessions(self, "embedded")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._sweep_forever)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            with anyio.CancelScope(shield=True):
                for session in list(self._live.values()):
                    if session.saved is not None:  # a release under way: over by its deadline
                        await session.saved.wait()
                async with anyio.create_task_group() as storing:  # each within its own deadline, side by side
                    for session in list(self._live.values()):
                        storing.start_soon(self._store_or_end, session)
        finally:
            tg, self._tg = self._tg, None
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)

    def session_counts(self) -> tuple[int, int]:
        """For /metrics: (live: its REPL in a sandbox here, released: kept as a snapshot only)."""
        live = sum(1 for s in self._live.values() if s.repl.sandbox is not None)
        return live, len(self._live) - live

    # -- the session port (ports/sessions.py) -----------------------------------------------
    async def find(self, session_id: str, *, owner: OwnerScope) -> FollowUp:
        session = await self._find(session_id, owner=owner)
        if session.running is not None:
            self.claim(session, "")  # raises the BusyError
        return FollowUp(session.session_id, bound=list(session.repl.contexts))

    async def check_can_keep(self) -> None:
        await self._sandboxes.check_snapshots()  # an image without dill cannot keep one

    async def start(self, request: RunRequest, engine: RLMEngine | None) -> ActiveRun:
        """Start a kept session's run: one at a time per session, its contexts pinned for the
        session's life, the session told when the run has ended. The session is looked up and
        claimed with no await in between: one that `close` or the sweep ended since the caller's
        `find` is refused with why, and nothing is opened for it."""
        if request.session_id is None:
            session = self.open(request.owner)
            request = request.model_copy(update={"session_id": session.session_id})
        else:
            session = self.get(request.session_id, owner=request.owner)
        self.claim(session, STARTING)
        run: ActiveRun | None = None
        try:
            await self.pin(session, request.context_ids)

            async def ended(done: ActiveRun) -> None:
                usage = done.result.usage if done.result is not None else None
                await self.finished(session, done.run_id, started=done.not_started is None, usage=usage)

            run = await self._runs.start(request, engine, repl=session.repl, on_end=ended)
            if session.running == STARTING:
                session.running = run.run_id
            return run
        finally:
            if run is None:
                await self.finished(session, STARTING, started=False)

    async def list(self, *, owner: OwnerScope) -> builtins.list[SessionView]:
        """Live sessions, then those stored in the data dir (taken back on their next follow-up)."""
        live = [s.view() for s in self._live.values() if sees(owner, s.owner)]
        return live + await self.stored(owner=owner)

    async def describe(self, session_id: str, *, owner: OwnerScope) -> SessionView:
        return (await self._find(session_id, owner=owner)).view()

    async def close(self, session_id: str, *, owner: OwnerScope) -> SessionView:
        session = await self._find(session_id, owner=owner)
        if session.running == SAVING:
            # Its snapshot is under way: stop it (its sandbox goes), then the session ends.
            session.closing = True
            if session.saving is not None:
                session.saving.cancel()
            if session.saved is not None:
                await session.saved.wait()
            await self._end(session, "closed")
            return session.view()
        if session.running == STARTING:
            raise BusyError(
                f"Session {session_id} is starting a run.",
                "Wait a moment, then cancel that run (rlm_cancel with the run_id rlm_list_sessions shows) "
                "or wait for it to end, and close the session.",
            )
        if session.running is not None:
            raise BusyError(
                f"Session {session_id} is answering run {session.running}.",
                f"Cancel it first (rlm_cancel with run_id={session.running}) or wait for it to end.",
            )
        await self._end(session, "closed")
        return session.view()

    # -- the parts of a session's life -------------------------------------------------------
    def open(self, owner: Owner) -> KeptSession:
        """A new session for `owner` (refused past RLM_MCP_MAX_SESSIONS_PER_OWNER)."""
        cap = self._settings.max_sessions_per_owner
        held = [s for s in self._live.values() if s.owner == owner]
        if len(held) >= cap:
            raise BusyError(
                f"You already hold {len(held)} kept sessions (RLM_MCP_MAX_SESSIONS_PER_OWNER={cap}).",
                "Close one you no longer need with rlm_close_session (rlm_list_sessions lists them), "
                "or run without keep_session.",
            )
        session = KeptSession(session_id=f"ses_{secrets.token_hex(10)}", owner=owner)
        self._live[session.session_id] = session
        return session

    async def _find(self, session_id: str, *, owner: OwnerScope) -> KeptSession:
        """`get`, taking back a session that a stopped process stored in the data dir."""
        if session_id not in self._live and session_id not in self._ended:
            stored = await session_shelf.claim_stored(session_id, owner, self._settings)
            if stored is not None:
                await self._adopt(stored)
        return self.get(session_id, owner=owner)

    async def _adopt(self, stored: session_files.StoredSession) -> None:
        session = await session_shelf.restore(stored, self._contexts, self._settings)
        if isinstance(session, str):
            self._remember(stored.session_id, Owner(stored.owner), session)
            return
        self._live[session.session_id] = session
        await self.pin(session, list(dict.fromkeys(stored.bound_context_ids)))
        logger.info("session %s taken back from the data dir", session.session_id)

    async def _store_or_end(self, session: KeptSession) -> None:
        """At shutdown: an idle session is stored for a later process, any other ends."""
        try:
            if session.running is None and await self._store(session):
                return  # another process on this data dir may take it back
        except Exception:
            logger.exception("storing session %s failed", session.session_id)
        await self._end(session, "shutdown")

    async def _store(self, session: KeptSession) -> bool:
        """Snapshot an idle session (if its sandbox is live) and write its record beside it in the data dir."""
        if session.repl.live:
            session.repl.snapshot = await self._snapshot(session)
        snapshot = session.repl.snapshot
        if snapshot is None or not await session_shelf.write_record(session, snapshot, self._settings):
            return False
        self._live.pop(session.session_id, None)
        session.ended = "shutdown"
        await session.repl.release()
        await session.pins.aclose()
        return True

    def why_ended(self, session_id: str) -> str | None:
        """Why a session of this process ended (None: it did not, or was stored for later)."""
        ended = self._ended.get(session_id)
        return ended[1] if ended is not None else None

    def _remember(self, session_id: str, owner: Owner, text: str) -> None:
        self._ended.put(session_id, (owner, text))

    def get(self, session_id: str, *, owner: OwnerScope) -> KeptSession:
        """The live session; a tool error that says why for an ended one, "unknown" for another
        owner's or one never seen."""
        session = self._live.get(session_id)
        if session is not None and sees(owner, session.owner):
            return session
        ended = self._ended.get(session_id)
        if ended is not None and sees(owner, ended[0]):
            raise NotFoundError(f"Session {session_id} {ended[1]}.", START_AGAIN)
        raise NotFoundError(f"Unknown session id '{session_id}'.", START_AGAIN)

    def claim(self, session: KeptSession, run_id: str) -> None:
        """Mark the session busy with `run_id`; a session runs one question at a time."""
        if session.running == SAVING:
            raise BusyError(
                f"Session {session.session_id} is being saved while its sandbox is given back.",
                "Ask again in a few seconds: the next run restores it in a fresh sandbox.",
            )
        if session.running == STARTING:
            raise BusyError(
                f"Session {session.session_id} is starting a run; a session runs one question at a time.",
                "Ask again in a moment (rlm_list_sessions shows the run once it has started).",
            )
        if session.running is not None:
            raise BusyError(
                f"Session {session.session_id} is still answering run {session.running}; a session runs one "
                "question at a time.",
                f"Wait for it (rlm_result with run_id={session.running} and wait_s), then ask again.",
            )
        session.running = run_id

    async def pin(self, session: KeptSession, context_ids: builtins.list[str]) -> None:
        """Keep the session's contexts from eviction while it lives (a restart reloads them)."""
        new = [cid for cid in context_ids if cid not in session.context_ids]
        if new:
            await session.pins.enter_async_context(self._contexts.in_use(new, owner=session.owner))
            session.context_ids.extend(new)

    async def finished(self, session: KeptSession, run_id: str, *, started: bool, usage: Usage | None = None) -> None:
        """The session's run ended: the session idles (or ends, if that run never started)."""
        if session.running == run_id:
            session.running = None
        if usage is not None:
            session.usage.merge(usage)
        session.last_used = time.monotonic()
        if session.ended is not None:
            # Ended while the run went on (the server stopping): the sandbox the run kept goes too.
            await session.repl.release()
            return
        session.run_ids.append(run_id)
        if not started and not session.repl.live and session.repl.runs == 0:
            await self._end(session, "failed")

    async def stored(self, *, owner: OwnerScope) -> builtins.list[SessionView]:
        """The sessions a stopped process stored in the data dir, as `list` shows them."""
        return await session_shelf.stored_views(self._settings, owner=owner, live=set(self._live))

    # -- ending ------------------------------------------------------------------------------
    async def _end(self, session: KeptSession, why: EndReason) -> None:
        if session.ended is not None:
            return
        session.ended = why
        self._live.pop(session.session_id, None)
        text = END_TEXT[why]
        if why in ("idle", "evicted", "shutdown") and session.repl.snapshot_error:
            text += f" ({session.repl.snapshot_error})"
        self._remember(session.session_id, session.owner, text)
        await session.let_go(self._settings.data_dir)
        logger.info("session %s ended (%s)", session.session_id, why)

    async def reclaim(self) -> bool:
        """A sandbox must open and no slot is free: the least recently used idle session that
        holds one gives it back. With a snapshot it lives on (its next run restores it in a fresh
        sandbox); without one it ends (`evicted`). False when no session is idle.

        The snapshot is taken in a task of this manager, not in the caller's (a run asking for a
        sandbox): the caller waits only for the slot, and its own deadline or cancellation ends
        that wait; the release goes on, bounded by the snapshot's deadline."""
        idle = [s for s in self._live.values() if s.running is None and s.repl.live]
        done = self._begin_release(min(idle, key=lambda s: s.last_used), "evicted") if idle else None
        if done is None:
            return False
        await done.wait()
        return True

    def _begin_release(self, session: KeptSession, why: EndReason) -> anyio.Event | None:
        """Start giving an idle session's sandbox back in a task of its own; the event is set when
        it is over. None when this manager is not running (nothing to run it in)."""
        if self._tg is None:
            return None
        done = anyio.Event()
        session.running = SAVING  # a follow-up meanwhile is refused: the REPL is being saved
        session.saved = done
        self._tg.start_soon(self._release, session, why, done)
        return done

    async def _release(self, session: KeptSession, why: EndReason, done: anyio.Event) -> None:
        """Give an idle session's sandbox back, kept as a snapshot of its namespace (taken now,
        inside the sandbox); a session whose namespace cannot be saved ends instead, and so does
        one closed meanwhile."""
        # Shielded so that shutdown lets it finish (bounded by the snapshot's deadline); `close`
        # cancels this very scope, which reaches the snapshot inside it.
        scope = session.saving = anyio.CancelScope(shield=True)
        if session.closing:  # closed before this task began: no snapshot to take
            scope.cancel()
        try:
            with scope:
                session.repl.snapshot = await self._snapshot(session)
                if session.repl.snapshot is not None:
                    await session.repl.release()
                    logger.info("session %s: sandbox released (%s); its snapshot stays", session.session_id, why)
        except Exception:
            logger.exception("releasing the sandbox of session %s failed", session.session_id)
        finally:
            with anyio.CancelScope(shield=True):
                session.saving = None
                if session.running == SAVING:
                    session.running = None
                if session.closing:
                    await self._end(session, "closed")
                elif session.repl.snapshot is None or session.repl.live:
                    await self._end(session, why)
                session.saved = None
                done.set()

    async def _snapshot(self, session: KeptSession) -> Snapshot | None:
        def held_by_others() -> int:
            return sum(
                s.repl.snapshot.size
                for s in self._live.values()
                if s.owner == session.owner and s is not session and s.repl.snapshot is not None
            )

        return await session_shelf.take_into_data_dir(session, self._settings, held_by_others=held_by_others)

    async def sweep(self) -> None:
        """End sessions idle past RLM_MCP_SESSION_IDLE_S or older than RLM_MCP_SESSION_MAX_AGE_S."""
        data_dir, max_age = self._settings.data_dir, self._settings.session_max_age_s
        await anyio.to_thread.run_sync(session_files.drop_older_than, data_dir, max_age)
        now = time.monotonic()
        for session in list(self._live.values()):
            if now - session.started >= self._settings.session_max_age_s and session.running is None:
                await self._end(session, "expired")
            elif (
                session.running is None
                and session.repl.live
                and now - session.last_used >= self._settings.session_idle_s
            ):
                self._begin_release(session, "idle")  # a task of its own: no session waits for another's

    async def _sweep_forever(self) -> None:
        while True:
            await sleep_to_tick(min(SWEEP_EVERY_S, self._settings.session_idle_s / 4))
            try:
                await self.sweep()
            except Exception:  # housekeeping must never take the server down
                logger.exception("sweeping idle sessions failed")
