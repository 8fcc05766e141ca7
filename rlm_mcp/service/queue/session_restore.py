"""A kept session's sandbox as a worker holds it (`Held`), and the restore of one this worker does
not hold: its contexts pinned and fetched into this host's cache, its histories, and its stored
snapshot copied to a file of this host, for a fresh sandbox to load (never on this host).
`sessions.WorkerSessions` owns what is held; this module builds it."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import anyio

from rlm_mcp.config import KeptSessionSettings
from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.engine.snapshot import Snapshot
from rlm_mcp.errors import NotFoundError, RlmMcpError
from rlm_mcp.owners import Owner
from rlm_mcp.ports.session_store import SessionRow, SessionStorePort
from rlm_mcp.service import session_files
from rlm_mcp.store.ports import ContextStorePort
from rlm_mcp.usage import Usage

LOOK_EVERY_S = 0.2  # while waiting for another worker's snapshot


@dataclass
class Held:
    """A session whose sandbox this worker holds (or is about to run)."""

    repl: SessionSandbox
    owner: Owner
    generation: int  # the session's runs recorded when this REPL was last in step with the database
    usage: Usage = field(default_factory=Usage)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False  # a run uses the REPL
    saving: anyio.Event | None = None  # set when the snapshot after the last run is stored (or failed)
    # The session's contexts, pinned against eviction (and in this host's cache) while this
    # worker holds its sandbox.
    pins: AsyncExitStack = field(default_factory=AsyncExitStack)
    pinned: set[str] = field(default_factory=set)

    @property
    def idle(self) -> bool:
        return not self.busy and self.saving is None and self.repl.live


async def restore(
    settings: KeptSessionSettings,
    store: SessionStorePort,
    contexts: ContextStorePort,
    row: SessionRow,
    *,
    worker_id: int | None,
) -> Held:
    """The session held here from `row` (busy: its run is about to use it), in a REPL not opened
    yet: restored from the database when it has run, else fresh. Raises NotFoundError when one of
    its contexts is gone (nothing is left pinned then)."""
    session_id = row.session_id
    row = await _await_snapshot(settings, store, row, worker_id)
    repl = SessionSandbox(session_id)
    owner = Owner(row.owner)
    pins = AsyncExitStack()
    unique = list(dict.fromkeys(row.context_ids))
    try:  # pinned and fetched into this host's cache: the fresh sandbox loads each by id
        infos = await pins.enter_async_context(contexts.in_use(unique, owner=owner))
    except RlmMcpError as exc:
        await pins.aclose()
        raise NotFoundError(
            f"Session {session_id} cannot go on: one of its contexts is gone ({exc.cause}).",
            "Start a new session: call rlm_complete (or rlm_start) with keep_session=true and the context_id(s).",
        ) from exc
    except BaseException:
        await pins.aclose()
        raise
    by_id = {info.context_id: info for info in infos}
    repl.contexts = [contexts.spec(by_id[cid]) for cid in row.context_ids]
    repl.context_count = len(repl.contexts)
    repl.histories = [list(h) for h in row.histories]
    repl.history_count = len(repl.histories)
    repl.runs = row.generation
    # Decided here, once: a session that has run is restored (from its snapshot when one is
    # stored, else its contexts and histories alone); a new one opens a fresh sandbox.
    repl.next_run = "restore" if row.generation else "fresh"
    stored = await _spool_in(settings, store, session_id, pins) if row.generation else None
    if stored is not None:
        taken_after, repl.snapshot = stored
        repl.snapshot_runs = taken_after if taken_after < row.generation else None
    return Held(
        repl=repl,
        owner=owner,
        generation=row.generation,
        usage=Usage.of(row.usage),
        busy=True,
        pins=pins,
        pinned=set(unique),
    )


async def _spool_in(
    settings: KeptSessionSettings, store: SessionStorePort, session_id: str, pins: AsyncExitStack
) -> tuple[int, Snapshot] | None:
    """The session's stored snapshot, copied to a file of this host (removed with `pins`, as
    the worker lets the session go); None when it has none."""
    path = await anyio.to_thread.run_sync(session_files.spool_path, settings.data_dir, session_id)
    pins.callback(path.unlink, missing_ok=True)
    try:
        stored = await store.read_snapshot_into(session_id, path)
    except BaseException:
        await pins.aclose()
        raise
    if stored is None:
        return None
    taken_after, size = stored
    return taken_after, Snapshot(path=path, size=size)


async def _await_snapshot(
    settings: KeptSessionSettings, store: SessionStorePort, row: SessionRow, worker_id: int | None
) -> SessionRow:
    """Another worker still taking the snapshot after the last run: wait for it, bounded."""
    with anyio.move_on_after(settings.session_snapshot_wait_s):
        while row.generation and row.snapshot_gen != row.generation and row.snapshot_error is None:
            if row.worker_id is None or row.worker_id == worker_id:
                break
            await anyio.sleep(LOOK_EVERY_S)
            fresh = await store.read(row.session_id)
            if fresh is None:
                break
            row = fresh
    return row
