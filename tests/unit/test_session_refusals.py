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
