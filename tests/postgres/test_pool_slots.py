"""A pool's callers beyond its connections wait in line for a slot (store/pg/db.py
`Database.connection`), not in psycopg_pool's own wait: a burst of statements larger than the
pool (a front's runs arriving at once on the queue's pool of four) gets every answer, never
more connections lent than the pool holds, and the pool itself counts no waiting request once its
connections are open. A caller whose slot does not come within the pool's timeout gets the
database's unavailable error, as one the pool kept waiting did."""

from __future__ import annotations

import anyio
import pytest

from rlm_mcp.store.pg import db as db_module
from rlm_mcp.store.pg.db import Database

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

SIZE = 3


async def _opened(url: str) -> Database:
    db = Database(url, replica=False, max_size=SIZE, min_size=SIZE)
    await db.open()
    await db.pool.wait()  # every connection open: a wait from now on would be the callers'
    return db


async def test_a_burst_beyond_the_pool_waits_for_slots_not_in_the_pool(pg_migrated_url: str) -> None:
    db = await _opened(pg_migrated_url)
    try:
        lent, most, answers = 0, 0, []
        gate = anyio.Event()

        async def one(n: int) -> None:
            nonlocal lent, most
            async with db.connection() as conn:
                lent += 1
                most = max(most, lent)
                if lent == SIZE:  # every connection out: the others queue behind these
                    gate.set()
                await gate.wait()
                cur = await conn.execute("SELECT %s::int AS n", (n,))
                row = await cur.fetchone()
                assert row is not None
                answers.append(row["n"])
                lent -= 1

        async with anyio.create_task_group() as tg:
            for n in range(4 * SIZE):
                tg.start_soon(one, n)
        assert sorted(answers) == list(range(4 * SIZE))
        assert most == SIZE
        stats = db.pool.get_stats()
        assert stats.get("requests_queued", 0) == 0  # psycopg_pool never queued one of them
        assert stats["requests_num"] == 4 * SIZE
    finally:
        await db.close()


async def test_a_slot_not_free_within_the_timeout_is_the_unavailable_error(
    pg_migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await _opened(pg_migrated_url)
    try:
        held = anyio.Event()
        release = anyio.Event()

        async def hold() -> None:
            async with db.connection():
                if db.pool.get_stats().get("pool_available", 0) == 0:
                    held.set()
                await release.wait()

        async with anyio.create_task_group() as tg:
            for _ in range(SIZE):
                tg.start_soon(hold)
            await held.wait()
            monkeypatch.setattr(db_module, "CONNECT_TIMEOUT_S", 0.05)
            with pytest.raises(db_module.DatabaseUnavailableError):
                async with db.connection():
                    pass
            release.set()
        monkeypatch.setattr(db_module, "CONNECT_TIMEOUT_S", 10.0)
        async with db.connection() as conn:  # every slot came back, the timed-out one too
            await conn.execute("SELECT 1")
        assert db.pool.get_stats().get("requests_queued", 0) == 0
    finally:
        await db.close()


async def test_a_waiter_cancelled_in_line_takes_no_slot(pg_migrated_url: str) -> None:
    db = await _opened(pg_migrated_url)
    try:
        release = anyio.Event()
        all_out = anyio.Event()
        out = 0

        async def hold() -> None:
            nonlocal out
            async with db.connection():
                out += 1
                if out == SIZE:
                    all_out.set()
                await release.wait()

        async def wait_in_line(scope: anyio.CancelScope) -> None:
            with scope:
                async with db.connection():
                    pytest.fail("lent a connection though cancelled")

        async with anyio.create_task_group() as tg:
            for _ in range(SIZE):
                tg.start_soon(hold)
            await all_out.wait()
            scope = anyio.CancelScope()
            tg.start_soon(wait_in_line, scope)
            await anyio.wait_all_tasks_blocked()
            assert db._slots.statistics().tasks_waiting == 1
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert db._slots.statistics().tasks_waiting == 0
            release.set()
        assert db._slots.value == SIZE  # every slot back, none kept by the cancelled waiter
        async with db.connection() as conn:
            await conn.execute("SELECT 1")
    finally:
        await db.close()
