"""Refusals about a kept session name what exists (issue 41, low): a session starting a run is
"starting a run", never "run starting" with `run_id=starting`; a session saving its snapshot is
closed by rlm_close_session, never refused with `run_id=(saving)`. No sandbox needed: the
session manager alone, with sessions in those states."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from rlm_mcp.errors import BusyError, NotFoundError
from rlm_mcp.owners import Owner
from rlm_mcp.ports.sessions import SAVING
from rlm_mcp.service import session_files
from rlm_mcp.service.sessions import STARTING, SessionManager
from rlm_mcp.store.ports import ContextStorePort
from tests.fixtures_engine import make_settings

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")


def _manager(tmp_path: Path) -> SessionManager:
    nothing = cast(Any, None)  # neither sandboxes nor runs are reached by these refusals
    return SessionManager(make_settings(tmp_path).kept_sessions, cast(ContextStorePort, nothing), nothing, nothing)


async def test_a_session_starting_a_run_says_so_without_a_placeholder_run_id(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    session = manager.open(ALICE)
    session.running = STARTING
    with pytest.raises(BusyError) as follow_up:
        manager.claim(session, "run_next")
    with pytest.raises(BusyError) as closing:
        await manager.close(session.session_id, owner=ALICE)
    for refused in (follow_up.value, closing.value):
        text = f"{refused.cause} {refused.fix}"
        assert "starting a run" in text and "run_id=starting" not in text and "run starting" not in text


async def test_a_session_saving_its_snapshot_is_closed_not_refused(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    session = manager.open(ALICE)
    session.running = SAVING  # its release had begun (here: nothing left to wait for)
    closed = await manager.close(session.session_id, owner=ALICE)
    assert closed.session_id == session.session_id and session.ended == "closed"
    with pytest.raises(NotFoundError, match=f"Session {session.session_id} was closed"):
        manager.get(session.session_id, owner=ALICE)


class _GoneContexts:
    """A context store in which every context was deleted."""

    async def get(self, context_id: str, *, owner: Owner) -> Any:
        raise NotFoundError(f"Unknown context id '{context_id}'.", "Store it again.")


async def test_a_stored_session_whose_context_is_gone_says_so_and_leaves_nothing_behind(tmp_path: Path) -> None:
    settings = make_settings(tmp_path).kept_sessions
    session_id = "ses_" + "ab" * 10
    stored = session_files.StoredSession(
        session_id=session_id,
        owner=str(ALICE),
        created_at=0.0,
        run_ids=["run_1"],
        bound_context_ids=["ctx_deleted"],
        histories=[],
        snapshot_bytes=3,
    )
    session_files.snapshot_path(settings.data_dir, session_id).write_bytes(b"abc")
    session_files.save(settings.data_dir, stored)
    nothing = cast(Any, None)
    manager = SessionManager(settings, cast(ContextStorePort, _GoneContexts()), nothing, nothing)
    with pytest.raises(NotFoundError) as follow_up:
        await manager.find(session_id, owner=ALICE)
    assert "one of its contexts is gone" in follow_up.value.cause and "ctx_deleted" in follow_up.value.cause
    assert session_files.peek(settings.data_dir) == []  # its record claimed, its snapshot discarded
    assert not session_files.snapshot_path(settings.data_dir, session_id).exists()
    with pytest.raises(NotFoundError) as again:  # remembered: the same words, not "unknown"
        await manager.find(session_id, owner=ALICE)
    assert again.value.cause == follow_up.value.cause
