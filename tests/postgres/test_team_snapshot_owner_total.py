"""The per-owner snapshot total holds when two of an owner's sessions store at once (issue 41,
finding 5): each store sums the owner's other snapshots under a lock of that owner, not only of
its own session's row, so the second one counts the first. Real PostgreSQL, in process."""

from __future__ import annotations

from pathlib import Path

import anyio
import psycopg
import pytest

from rlm_mcp.ports.session_store import AfterRun
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_sessions import DAY, replica
from tests.fixtures_store import summary

pytestmark = pytest.mark.anyio


async def test_two_sessions_of_one_owner_storing_at_once_stay_within_the_owner_cap(tmp_path: Path, pg_url: str) -> None:
    async with replica(tmp_path, pg_url, "a") as (a, queue), replica(tmp_path, pg_url, "b") as (b, _):
        files = {}
        for sid in ("ses_t1", "ses_t2"):
            await a.open(sid, "alice", f"run_{sid}", cap=4, max_age_s=DAY)
            await queue.enqueue(summary(f"run_{sid}", owner="alice"), 1)
            assert await a.finish_run(sid, f"run_{sid}", AfterRun(worker_id=1, began=True, context_ids=["c"]))
            files[sid] = tmp_path / f"{sid}.spool"
            files[sid].write_bytes(sid.encode() * (1 << 19))  # 3 MiB each, from a file as a worker stores it
        cap = 5 << 20  # room for one of them, not both
        results: dict[str, str | None] = {}

        async def store(where: object, sid: str) -> None:
            assert where is a or where is b
            results[sid] = await where.save_snapshot(sid, 1, files[sid], owner_cap=cap)

        # Both stores are held at the snapshot table until both are under way, so that each has
        # summed the owner's total before either wrote (what two workers storing at once do).
        async with await psycopg.AsyncConnection.connect(pg_url) as blocker:
            await blocker.execute("BEGIN")
            await blocker.execute("LOCK TABLE rlm_session_snapshots IN SHARE MODE")
            async with anyio.create_task_group() as tg:
                tg.start_soon(store, a, "ses_t1")
                tg.start_soon(store, b, "ses_t2")

                async def both_waiting() -> bool:
                    async with await psycopg.AsyncConnection.connect(pg_url) as look:
                        cur = await look.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND wait_event_type = 'Lock'"
                        )
                        row = await cur.fetchone()
                    return row is not None and row[0] == 2

                await wait_until(both_waiting, what="both stores waiting on a lock")
                await blocker.execute("COMMIT")

        stored = [sid for sid, why in results.items() if why is None]
        refused = [why for why in results.values() if why is not None]
        assert len(stored) == 1, results
        assert len(refused) == 1 and "RLM_MCP_SESSION_SNAPSHOT_BYTES_PER_OWNER" in refused[0]
        rows = [await a.read(sid) for sid in ("ses_t1", "ses_t2")]
        assert sum(row.snapshot_bytes or 0 for row in rows if row is not None) <= cap
        got = await a.read_snapshot(stored[0])
        assert got == (1, files[stored[0]].read_bytes())
        # Streamed back to a file as a worker restores it, byte for byte.
        back = tmp_path / "back.snap"
        assert await a.read_snapshot_into(stored[0], back) == (1, 3 << 20)
        assert back.read_bytes() == files[stored[0]].read_bytes() and back.stat().st_mode & 0o077 == 0
