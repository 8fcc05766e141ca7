"""The LISTEN loop (store/pg/workers.py `listen_forever`) sleeps on its connection's socket and
takes what arrived without waiting: every notification reaches its callback once and in order,
in bursts and while the keep-alive statement runs."""

from __future__ import annotations

import anyio
import psycopg
import pytest

from rlm_mcp.store.pg import workers
from rlm_mcp.testing.waiting import wait_until

pytestmark = pytest.mark.anyio

CHANNEL = "rlm_test_listen"


async def _listened(pg_url: str, send: int, *, in_one_transaction: bool) -> list[str]:
    got: list[str] = []
    connected = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: workers.listen_forever(pg_url, CHANNEL, got.append, on_connect=connected.set))
        await connected.wait()
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            if in_one_transaction:
                async with conn.transaction():
                    for i in range(send):
                        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(i)))
            else:
                for i in range(send):
                    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(i)))
        await wait_until(lambda: len(got) >= send, what=f"{send} notifications")
        tg.cancel_scope.cancel()
    return got


async def test_a_burst_arrives_whole_and_in_order(pg_url: str) -> None:
    assert await _listened(pg_url, 300, in_one_transaction=True) == [str(i) for i in range(300)]


async def test_notifications_during_the_keepalive_are_kept(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A keep-alive statement after nearly every quiet instant: notifications arriving while it
    # runs are read by psycopg then, and must still reach the callback (once each).
    monkeypatch.setattr(workers, "KEEPALIVE_S", 0.001)
    assert await _listened(pg_url, 200, in_one_transaction=False) == [str(i) for i in range(200)]
