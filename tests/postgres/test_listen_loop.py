"""The LISTEN loop (store/pg/workers.py `listen_forever`) sleeps on its connection's socket and
takes what arrived without waiting: every notification reaches its callback once and in order,
in bursts and while the keep-alive statement runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from rlm_mcp.ports.runs import LiveSummary
from rlm_mcp.store.pg import queue_statements as sql
from rlm_mcp.store.pg import workers
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_sessions import team
from tests.fixtures_store import summary

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


async def test_a_replica_hears_only_the_runs_it_follows_from_when_it_follows_them(tmp_path: Path, pg_url: str) -> None:
    """Each run announces itself on its own channel (issue 39 item 6: every replica used to be
    woken for every run's every live summary): a replica hears a run from when it follows it
    (its LISTEN goes out while the loop waits) until it forgets it, plus the shared channel an
    earlier version's workers announce on; another replica hears none of it."""
    async with team(tmp_path, pg_url) as (_, follower, _settings), team(tmp_path / "b", pg_url) as (_, other, _s):
        heard: dict[str, list[str]] = {"follower": [], "other": []}
        connected = [anyio.Event(), anyio.Event()]
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: follower.listen_runs(heard["follower"].append, on_connect=connected[0].set))
            tg.start_soon(lambda: other.listen_runs(heard["other"].append, on_connect=connected[1].set))
            for event in connected:
                await event.wait()
            await follower.enqueue(summary("run_followed00000001"), 1)
            await follower.enqueue(summary("run_unfollowed000001"), 1)
            await follower.follow_run("run_followed00000001")
            # Its LISTEN is in place once the loop has sent it: a marker sent after the follow
            # and before the announcements arrives first only if it is.
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:

                async def announce(payload: str, run_id: str) -> None:
                    await conn.execute("SELECT pg_notify(%s, %s)", (sql.run_channel(run_id), payload))

                await wait_until_listening(conn, follower, "run_followed00000001")
                await follower.cancel("run_unfollowed000001", summary("run_unfollowed000001").ended("cancelled", "x"))
                await announce("run_followed00000001 {}", "run_followed00000001")
                await follower.cancel("run_followed00000001", summary("run_followed00000001").ended("cancelled", "x"))
                await conn.execute("SELECT pg_notify(%s, %s)", (sql.CHANNEL, "run_old_version_000001"))
                # Each session gets its notifications in commit order, so once the other replica
                # has heard the last one it has heard whatever it was going to hear before it.
                await wait_until(
                    lambda: len(heard["follower"]) >= 3 and len(heard["other"]) >= 1,
                    what="the followed run's announcements, and the shared channel's on both replicas",
                )
                assert heard["follower"] == [
                    "run_followed00000001 {}",
                    "run_followed00000001",
                    "run_old_version_000001",
                ]
                assert heard["other"] == ["run_old_version_000001"]
            tg.cancel_scope.cancel()


async def wait_until_listening(conn: psycopg.AsyncConnection[Any], queue: PgRunQueue, run_id: str) -> None:
    """Until the listener's connection LISTENs to the run's channel (pg_listening_channels is
    per session: asked through the server's own view of every session's channels)."""
    channel = sql.run_channel(run_id)

    async def listening() -> bool:
        cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s", (f"%LISTEN {channel}%",))
        row = await cur.fetchone()
        return bool(row and row[0])

    await wait_until(listening, what=f"the LISTEN of {run_id}")


async def test_a_run_is_heard_from_the_moment_following_it_returns(tmp_path: Path, pg_url: str) -> None:
    """A front follows a run before it queues it (and before it reads the row of a run it
    finds): an announcement sent once `follow` has returned reaches the follower. Before, the
    LISTEN went out later, on the listener's next turn, and a worker quick enough announced
    into the gap; the follower heard that only at its next row poll (RLM_MCP_QUEUE_POLL_S)."""
    from rlm_mcp.service.queue.wakeups import Wakeups

    async with team(tmp_path, pg_url) as (_, queue, _settings):
        wakeups = Wakeups(queue)
        told: dict[str, anyio.Event] = {}
        carried: dict[str, object] = {}

        def on_wake(run_id: str, state: object) -> None:
            carried[run_id] = state
            told.setdefault(run_id, anyio.Event()).set()

        wakeups.on_wake = on_wake
        async with anyio.create_task_group() as tg:
            tg.start_soon(wakeups.listen_forever)
            # The listener is connected once a run followed now is woken by what it hears.
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await wakeups.follow("run_first_followed01")
                await wait_until_listening(conn, queue, "run_first_followed01")
                for n in range(20):  # each at once after its follow: none may fall into a gap
                    run_id = f"run_followed_now{n:04d}"
                    await wakeups.follow(run_id)
                    await conn.execute(
                        "SELECT pg_notify(%s, %s)", (sql.run_channel(run_id), run_id + ' {"iterations": 1}')
                    )
                    with anyio.fail_after(30):  # a bound, not a timing: a missed one never comes
                        await told.setdefault(run_id, anyio.Event()).wait()
                    live = carried[run_id]
                    assert isinstance(live, LiveSummary) and live.iterations == 1  # the note itself, not a poll
                    wakeups.forget(run_id)
            tg.cancel_scope.cancel()


async def test_the_queue_listener_says_when_its_connection_is_lost_and_back(tmp_path: Path, pg_url: str) -> None:
    """`listen_queue` calls `on_disconnect` when its connection dies (a worker then polls the
    queue every poll interval again) and `on_connect` once it listens again."""
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        said: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: queue.listen_queue(
                    said.append, on_connect=lambda: said.append("up"), on_disconnect=lambda: said.append("down")
                )
            )
            await wait_until(lambda: said == ["up"], what="the listener connected")
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE %s AND pid <> pg_backend_pid()",
                    (f"%LISTEN {sql.QUEUE_CHANNEL}%",),
                )
                await wait_until(lambda: said == ["up", "down", "up"], what="the listener lost and back")
                await conn.execute("SELECT pg_notify(%s, 'queued')", (sql.QUEUE_CHANNEL,))
                await wait_until(lambda: said[-1] == "queued", what="a note on the new connection")
            tg.cancel_scope.cancel()
        assert said == ["up", "down", "up", "queued", "down"]  # cancelled: its connection ends too


async def test_a_ping_answered_on_the_listeners_session_comes_after_everything_announced_before_it(
    tmp_path: Path, pg_url: str
) -> None:
    """`listener_alive` (the silence timer's question): False while no listener is connected;
    once one is, a round trip on its session, answered after every notification committed before
    it was handed to the callback (PostgreSQL sends a session's notifications ahead of a later
    statement's answer), so a quiet front need not read its runs' rows."""
    async with team(tmp_path, pg_url) as (_, queue, _settings):
        assert not await queue.listener_alive(0.5)  # nothing listens yet
        heard: list[str] = []
        connected = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: queue.listen_runs(heard.append, on_connect=connected.set))
            await connected.wait()
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                for round_ in range(3):
                    for i in range(40):
                        await conn.execute("SELECT pg_notify(%s, %s)", (sql.CHANNEL, f"run_ping_{round_}_{i:04d}"))
                    assert await queue.listener_alive(30)
                    assert len(heard) == 40 * (round_ + 1)  # all of them, before the answer
            tg.cancel_scope.cancel()
        assert heard == [f"run_ping_{r}_{i:04d}" for r in range(3) for i in range(40)]
