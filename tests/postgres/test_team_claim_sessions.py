"""A worker whose image cannot restore a kept session (no dill) claims no session's run (issue 41,
finding 6): its claim passes over them, to a worker that can, and still takes every other run.
Real PostgreSQL, in process; the worker's side (asking its image once) is `QueueWorker`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures_sessions import team
from tests.fixtures_store import summary

pytestmark = pytest.mark.anyio


async def test_a_claim_without_sessions_passes_over_a_sessions_run(tmp_path: Path, pg_url: str) -> None:
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        worker = await queue.register_worker("owner-nodill", 4)
        # Queued first, so the fair order would hand it out first. Its query names a session too,
        # as text: only the record's own field counts.
        await queue.enqueue(summary("run_in_session0000001", session_id="ses_0123456789abcdef0123"), 1)
        await queue.enqueue(summary("run_plain000000000001", query='"session_id": "ses_x"'), 1)
        plain = await queue.claim(worker, 8, 8, sessions=False)
        assert plain is not None and plain.run_id == "run_plain000000000001"
        assert await queue.claim(worker, 8, 8, sessions=False) is None
        able = await queue.claim(worker, 8, 8)
        assert able is not None and able.run_id == "run_in_session0000001"
