"""A worker's side of team-mode kept sessions: the live sandboxes it holds between runs.

A session's state lives in the database (`store.pg.sessions`): its contexts, its conversations,
its usage and its snapshot. A worker that ran one of its runs keeps the sandbox alive and is
named as its holder; a follow-up prefers that worker for RLM_MCP_SESSION_PREFER_WORKER_S
(`store.pg.queue.PgRunQueue.claim`) and reuses the live REPL (the warm path). Any other worker restores
the session from the database: a fresh sandbox, the contexts reloaded by id, the snapshot loaded
inside the sandbox (never on this host).

After every run the snapshot is taken in the background, once the run's result is out (the result
never waits for it); a follow-up that reaches this worker meanwhile waits for it (at most
RLM_MCP_SESSION_SNAPSHOT_WAIT_S), then reuses the live sandbox. So a worker killed between two
runs loses nothing once that snapshot is stored; killed before, the next run restores the one
before it, says so in its first output, and binds every history again.

This worker lets a live sandbox go when the database says another worker moved the session on,
when the session ended, after RLM_MCP_SESSION_IDLE_S without a run, when a run needs its slot
(least recently used first), when its snapshot ran past its deadline (`snapshot_deadline_s`: its
state is then unknown), and at shutdown; the session lives on in the database. A snapshot goes
to the database through a file of this host (`session_files.spool_path`), a piece at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio

from rlm_mcp.config import KeptSessionSettings
from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.engine.snapshot import (
    ReplRestarted,
    SnapshotTimedOut,
    SnapshotUnavailable,
    snapshot_chunk,
    snapshot_deadline_s,
    take_snapshot,
)
from rlm_mcp.errors import NotFoundError, RlmMcpError
from rlm_mcp.observability import metrics
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.ports.session_store import AfterRun, SessionStorePort
from rlm_mcp.service import session_files
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue.session_restore import Held, restore
from rlm_mcp.store.ports import ContextStorePort
from rlm_mcp.ticks import sleep_to_tick

log = logging.getLogger("rlm_mcp.queue")

SWEEP_EVERY_S = 5.0


class WorkerSessions:
    """The kept sessions whose sandboxes this worker holds; enter it before the worker."""

    def __init__(self, settings: KeptSessionSettings, store: SessionStorePort, contexts: ContextStorePort) -> None:
        self._settings = settings
        self._store = store
        self._contexts = contexts
        # This worker's id once registered (set by the worker that enters these sessions).
        self.worker_id: Callable[[], int | None] = lambda: None
        self._held: dict[str, Held] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> WorkerSessions:
        metrics.watch_sessions(self, "team")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._sweep_forever)
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        try:
            with anyio.CancelScope(shield=True):
                # Snapshots under way are let finish (bounded): the session then loses nothing.
                with anyio.move_on_after(self._settings.session_snapshot_wait_s):
                    for held in list(self._held.values()):
                        if held.saving is not None:
                            await held.saving.wait()
                for session_id in list(self._held):
                    await self._drop(session_id, "this worker is stopping")
        finally:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)

    def session_counts(self) -> tuple[int, int]:
        """For /metrics: (live: the sessions whose sandbox this worker holds, released: none, as
        a released team session is kept in the database, for any worker)."""
        return sum(1 for held in self._held.values() if held.repl.sandbox is not None), 0

    # --- what the worker asks ---------------------------------------------------------------

    @property
    def reclaimable(self) -> int:
        """Sandboxes held by idle sessions: a run may take their slots (`reclaim`)."""
        return sum(1 for held in self._held.values() if held.idle)

    async def reclaim(self) -> bool:
        """A sandbox must open and no slot is free: the least recently used idle session gives
        its sandbox back (its snapshot is in the database). False when none is idle."""
        idle = [(held.last_used, sid) for sid, held in self._held.items() if held.idle]
        if not idle:
            return False
        await self._drop(min(idle)[1], "its slot was needed by another run")
        return True

    async def prepare(self, request: RunRequest) -> SessionSandbox:
        """The REPL a session's run continues: the live one when this worker holds the session
        as the database has it, else a fresh one to restore. Raises an RlmMcpError when the
        session cannot go on (the run then ends without starting)."""
        session_id = request.session_id
        assert session_id is not None
        held = self._held.get(session_id)
        if held is not None and held.saving is not None:
            # The snapshot after the previous run is being taken in this very sandbox.
            with anyio.move_on_after(self._settings.session_snapshot_wait_s):
                await held.saving.wait()
        row = await self._store.read(session_id)
        if row is None or row.owner != request.owner or row.state != "open":
            raise NotFoundError(
                f"Session {session_id} ended before this run started.",
                "Start a new session: call rlm_complete (or rlm_start) with keep_session=true.",
            )
        held = self._held.get(session_id)
        if held is not None and held.repl.live and held.generation == row.generation and held.saving is None:
            held.busy = True
            log.info("session %s: warm follow-up in the live sandbox", session_id)
            return held.repl
        if held is not None:
            await self._drop(session_id, "the session went on without it")
        held = await restore(self._settings, self._store, self._contexts, row, worker_id=self.worker_id())
        self._held[session_id] = held
        if held.generation:
            log.info("session %s: restoring on this worker (generation %d)", session_id, held.generation)
        return held.repl

    def on_result(self, leaving: Callable[[], bool]) -> Callable[[ActiveRun], Awaitable[None]]:
        """The hook a session's run calls before its final record: `recorded`, unless the run is
        `leaving` this worker (no longer its own, or back to the queue: it runs again elsewhere,
        in the same session), then `forget_run`."""

        async def hook(run: ActiveRun) -> None:
            await (self.forget_run(run) if leaving() else self.recorded(run))

        return hook

    async def recorded(self, run: ActiveRun) -> None:
        """Before the run's final record: the session's state as the REPL has it now, in the
        database; this worker holds its sandbox. The snapshot is started by `ended`."""
        session_id = run.request.session_id
        held = self._held.get(session_id or "")
        if session_id is None or held is None:
            return
        repl = held.repl
        if run.result is not None:
            held.usage.merge(run.result.usage)
        try:
            generation = await self._store.finish_run(
                session_id,
                run.run_id,
                AfterRun(
                    worker_id=self.worker_id() if repl.live else None,
                    context_ids=[spec.context_id or "" for spec in repl.contexts],
                    histories=repl.histories,
                    usage=held.usage.to_dict(),
                    began=run.began,
                ),
            )
        except BaseException:
            # Not recorded (the database is away): this REPL is no longer the session's as the
            # database has it; the next run restores the last snapshot stored.
            with anyio.CancelScope(shield=True):
                await self._drop(session_id, "its run's end could not be recorded")
            raise
        held.busy = False
        held.last_used = time.monotonic()
        if not repl.live:  # the run never opened its REPL: nothing is held here
            await self._drop(session_id, "its run did not open it")
            return
        if generation is None:  # the session moved on without this run (another attempt took it)
            await self._drop(session_id, "the session moved on")
            return
        held.generation = generation
        if run.began:
            held.saving = anyio.Event()  # a follow-up arriving now waits for the snapshot

    async def _pin(self, session_id: str, held: Held) -> None:
        """Pin the contexts this run added, for as long as this worker holds the session."""
        new = [spec.context_id for spec in held.repl.contexts if spec.context_id and spec.context_id not in held.pinned]
        if not new:
            return
        try:
            await held.pins.enter_async_context(self._contexts.in_use(list(dict.fromkeys(new)), owner=held.owner))
            held.pinned.update(new)
        except RlmMcpError as exc:  # deleted meanwhile: a restore will say so
            log.info("session %s: could not pin its new contexts: %s", session_id, exc)

    async def ended(self, run: ActiveRun) -> None:
        """After the run's final record (its result is out): the snapshot, in the background."""
        session_id = run.request.session_id or ""
        held = self._held.get(session_id)
        if held is None or held.saving is None or self._tg is None:
            return
        self._tg.start_soon(self._snapshot, session_id, held)

    async def forget_run(self, run: ActiveRun) -> None:
        """The run is no longer this worker's, or goes back to the queue: its REPL is not the
        session's any more (the session's row is left as it was)."""
        held = self._held.get(run.request.session_id or "")
        if held is not None:
            held.busy = False
            await self._drop(run.request.session_id or "", "its run left this worker")

    # --- snapshots and release --------------------------------------------------------------

    async def _snapshot(self, session_id: str, held: Held) -> None:
        saving, generation = held.saving, held.generation
        settings = self._settings
        try:
            await self._pin(session_id, held)
            sandbox = held.repl.sandbox
            if settings.session_snapshot_max_bytes <= 0:
                raise SnapshotUnavailable("snapshots are off (RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES=0)")
            if sandbox is None:
                raise SnapshotUnavailable("the session's sandbox was gone")
            started = time.monotonic()
            spool = await anyio.to_thread.run_sync(session_files.spool_path, settings.data_dir, session_id)
            try:
                snapshot = await take_snapshot(
                    sandbox,
                    spool,
                    max_bytes=settings.session_snapshot_max_bytes,
                    chunk_chars=snapshot_chunk(settings.cell_output_bytes),
                    deadline_s=snapshot_deadline_s(settings.cell_timeout_s, settings.session_snapshot_wait_s),
                )
                why = await self._store.save_snapshot(
                    session_id, generation, spool, owner_cap=settings.session_snapshot_bytes_per_owner
                )
            finally:
                spool.unlink(missing_ok=True)
            held.repl.snapshot_error = why
            log.info(
                "session %s: snapshot after run %d %s (%d bytes, %.2f s)",
                session_id,
                generation,
                "stored" if why is None else f"not stored: {why}",
                snapshot.size,
                time.monotonic() - started,
            )
        except (ReplRestarted, SnapshotTimedOut) as exc:
            # The live REPL lost the namespace, or its state is unknown after a snapshot that ran
            # past its deadline: the sandbox goes (its slot comes back), and the next run restores
            # the last snapshot stored (and rebinds every history) rather than going on in it.
            log.warning("session %s: %s; its sandbox is let go", session_id, exc)
            held.saving = None
            if isinstance(exc, SnapshotTimedOut):
                await self._record_failure(session_id, generation, str(exc))
            await self._drop(session_id, str(exc))
        except (SnapshotUnavailable, RlmMcpError, OSError) as exc:
            held.repl.snapshot_error = str(exc)
            log.warning("session %s: no snapshot after run %d (%s)", session_id, generation, exc)
            await self._record_failure(session_id, generation, str(exc))
        except Exception:
            log.exception("the snapshot of session %s failed", session_id)
        finally:
            held.saving = None
            if saving is not None:
                saving.set()

    async def _record_failure(self, session_id: str, generation: int, why: str) -> None:
        try:
            await self._store.snapshot_failed(session_id, generation, why)
        except RlmMcpError as failed:
            log.info("could not record why session %s has no snapshot: %s", session_id, failed)

    async def _drop(self, session_id: str, why: str) -> None:
        """Let the session's sandbox go (the session itself lives on in the database)."""
        held = self._held.pop(session_id, None)
        if held is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await held.repl.release()
            except Exception:
                log.exception("releasing the sandbox of session %s failed", session_id)
            try:
                await held.pins.aclose()
            except Exception:
                log.exception("unpinning the contexts of session %s failed", session_id)
            worker_id = self.worker_id()
            if worker_id is not None:
                try:
                    await self._store.let_go(session_id, worker_id)
                except RlmMcpError as exc:
                    log.info("could not record that session %s's sandbox was released: %s", session_id, exc)
        log.info("session %s: sandbox released on this worker (%s)", session_id, why)

    async def sweep(self) -> None:
        """Let go of sandboxes whose sessions moved on, ended or idled out; expire old sessions."""
        settings = self._settings
        await self._store.expire(max_age_s=settings.session_max_age_s)
        # Spool files a crashed worker left behind on this host.
        await anyio.to_thread.run_sync(session_files.drop_older_than, settings.data_dir, settings.session_max_age_s)
        idle = {sid: held for sid, held in self._held.items() if held.idle}
        states = await self._store.holders(list(idle))
        me, now = self.worker_id(), time.monotonic()
        for sid, held in idle.items():
            state = states.get(sid)
            if state is None or state[0] != "open":
                await self._drop(sid, "the session ended")
            elif state[1] != me or state[2] != held.generation:
                await self._drop(sid, "the session went on elsewhere")
            elif now - held.last_used >= settings.session_idle_s:
                await self._drop(sid, "idle past RLM_MCP_SESSION_IDLE_S")

    async def _sweep_forever(self) -> None:
        while True:
            await sleep_to_tick(min(SWEEP_EVERY_S, self._settings.session_idle_s / 4))
            try:
                await self.sweep()
            except Exception:  # housekeeping must never take the worker down
                log.exception("sweeping the kept sessions' sandboxes failed")
