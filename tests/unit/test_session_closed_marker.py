"""`rlm-mcp sessions close` leaves a marker so that a later follow-up says the session "was
closed" (issue 41 item 9); the marker is pruned with the sessions' maximum age, and closing a
session that is not stored says so without leaving one."""

from __future__ import annotations

from pathlib import Path

from rlm_mcp.service import session_files
from rlm_mcp.service.session_files import StoredSession

SID = "ses_" + "ab" * 10


def stored(data_dir: Path) -> None:
    snapshot = session_files.snapshot_path(data_dir, SID)  # its snapshot file comes first
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_bytes(b"snapshot")
    session = StoredSession(SID, "local", 1.0, ["run_1"], ["ctx_1"], [[]], 8)
    session_files.save(data_dir, session)


def test_a_closed_session_is_marked_until_its_maximum_age(tmp_path: Path) -> None:
    stored(tmp_path)
    assert session_files.closed_by(tmp_path, SID) is None
    assert session_files.close(tmp_path, SID, "local")
    assert session_files.owner_of(tmp_path, SID) is None and session_files.peek(tmp_path) == []
    assert session_files.closed_by(tmp_path, SID) == "local"
    session_files.drop_older_than(tmp_path, 3600)
    assert session_files.closed_by(tmp_path, SID) == "local"  # younger than the maximum age
    session_files.drop_older_than(tmp_path, 0)
    assert session_files.closed_by(tmp_path, SID) is None


def test_closing_what_is_not_stored_leaves_no_marker(tmp_path: Path) -> None:
    assert not session_files.close(tmp_path, SID, "local")
    assert session_files.closed_by(tmp_path, SID) is None
    assert session_files.closed_by(tmp_path, "../../etc/passwd") is None
