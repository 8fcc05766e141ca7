"""An embedded kept session and the data dir: its snapshot taken into its file there, its record
written when the server stops, taken back by a later process, listed while stored
(service/session_files.py is the files themselves; `sessions.SessionManager` decides when)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from rlm_mcp.config import KeptSessionSettings
from rlm_mcp.engine.snapshot import Snapshot, SnapshotUnavailable, snapshot_chunk, snapshot_deadline_s, take_snapshot
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.owners import Owner, OwnerScope, sees
from rlm_mcp.ports.sessions import SessionView
from rlm_mcp.service import session_files
from rlm_mcp.service.kept import KeptSession
from rlm_mcp.store.ports import ContextStorePort

logger = logging.getLogger("rlm_mcp.service")


async def take_into_data_dir(
    session: KeptSession, settings: KeptSessionSettings, *, held_by_others: Callable[[], int]
) -> Snapshot | None:
    """Take the session's snapshot into its file in the data dir (the one before stays until
    this one is whole and allowed); None, with the reason kept, when there is none.
    `held_by_others` is what the owner's other sessions' snapshots hold, read once this one is
    taken. The caller shields it (a release and shutdown let it finish); its deadline bounds it."""
    sandbox, limit = session.repl.sandbox, settings.session_snapshot_max_bytes
    if sandbox is None or limit <= 0:
        session.repl.snapshot_error = "snapshots are off (RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES=0)"
        return None
    data_dir = settings.data_dir
    taking = await anyio.to_thread.run_sync(session_files.taking_path, data_dir, session.session_id)
    try:
        snapshot = await take_snapshot(
            sandbox,
            taking,
            max_bytes=limit,
            chunk_chars=snapshot_chunk(settings.cell_output_bytes),
            deadline_s=snapshot_deadline_s(settings.cell_timeout_s, settings.session_snapshot_wait_s),
        )
    except (SnapshotUnavailable, RlmMcpError, OSError) as exc:
        taking.unlink(missing_ok=True)
        session.repl.snapshot_error = str(exc)
        logger.warning("session %s: no snapshot (%s)", session.session_id, exc)
        return None
    except BaseException:
        taking.unlink(missing_ok=True)
        raise
    held = held_by_others()
    cap = settings.session_snapshot_bytes_per_owner
    if held + snapshot.size > cap:
        taking.unlink(missing_ok=True)
        session.repl.snapshot_error = (
            f"its snapshot ({snapshot.size} bytes) would take its owner's sessions past "
            f"RLM_MCP_SESSION_SNAPSHOT_BYTES_PER_OWNER={cap} ({held} bytes held)"
        )
        logger.warning("session %s: no snapshot (%s)", session.session_id, session.repl.snapshot_error)
        return None
    path = await anyio.to_thread.run_sync(session_files.commit, taking, data_dir, session.session_id)
    session.repl.snapshot_error = None
    return Snapshot(path=path, size=snapshot.size)


async def write_record(session: KeptSession, snapshot: Snapshot, settings: KeptSessionSettings) -> bool:
    """Write the record that lets a later process take the session back (its snapshot is already
    in its file); False, logged, when the data dir refused it."""
    stored = session_files.StoredSession(
        session_id=session.session_id,
        owner=str(session.owner),
        created_at=session.created_at,
        run_ids=list(session.run_ids),
        bound_context_ids=[spec.context_id or "" for spec in session.repl.contexts],
        histories=session.repl.histories,
        snapshot_bytes=snapshot.size,
    )
    try:
        await anyio.to_thread.run_sync(session_files.save, settings.data_dir, stored)
    except OSError:
        logger.exception("storing session %s failed", session.session_id)
        return False
    return True


async def claim_stored(
    session_id: str, owner: OwnerScope, settings: KeptSessionSettings
) -> session_files.StoredSession | None:
    """The stored session `owner` may see, claimed from the data dir for this process (None: no
    such record, another owner's, or another process claimed it first)."""
    data_dir = settings.data_dir
    stored_owner = await anyio.to_thread.run_sync(session_files.owner_of, data_dir, session_id)
    if stored_owner is None or not sees(owner, stored_owner):
        return None
    return await anyio.to_thread.run_sync(session_files.claim, data_dir, session_id)


async def restore(
    stored: session_files.StoredSession, contexts: ContextStorePort, settings: KeptSessionSettings
) -> KeptSession | str:
    """The claimed session as this process's, its REPL to be restored from the snapshot on its
    next run; or why it cannot go on (its stored files are then removed)."""
    session = KeptSession(session_id=stored.session_id, owner=Owner(stored.owner))
    session.created_at = stored.created_at
    session.started = time.monotonic() - max(0.0, time.time() - stored.created_at)
    session.run_ids = list(stored.run_ids)
    repl = session.repl
    try:
        infos = [await contexts.get(cid, owner=session.owner) for cid in stored.bound_context_ids]
    except RlmMcpError as exc:
        await anyio.to_thread.run_sync(session_files.discard, settings.data_dir, session.session_id)
        return f"cannot go on: one of its contexts is gone ({exc.cause})"
    repl.contexts = [contexts.spec(info) for info in infos]
    repl.context_count = len(repl.contexts)
    repl.histories = [list(h) for h in stored.histories]
    repl.history_count = len(repl.histories)
    repl.runs = len(stored.run_ids)
    path = await anyio.to_thread.run_sync(session_files.snapshot_path, settings.data_dir, session.session_id)
    repl.snapshot = Snapshot(path=path, size=stored.snapshot_bytes)
    repl.next_run = "restore"  # its REPL is gone: the next run loads the snapshot in a fresh sandbox
    return session


async def stored_views(settings: KeptSessionSettings, *, owner: OwnerScope, live: set[str]) -> list[SessionView]:
    """The sessions a stopped process stored in the data dir (none of `live`), as the session
    list shows them."""
    records = await anyio.to_thread.run_sync(session_files.peek, settings.data_dir)
    return [
        SessionView(
            session_id=r["session_id"],
            runs=r.get("run_ids") or [],
            running=None,
            contexts_bound=len(r.get("bound_context_ids") or []),
            sandbox_live=False,
            stored=True,
            snapshot_bytes=r.get("snapshot_bytes"),
            created_at=r.get("created_at"),
        )
        for r in records
        if sees(owner, str(r.get("owner"))) and r.get("session_id") not in live
    ]
