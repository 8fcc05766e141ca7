"""Team-mode worker state (`rlm_workers`) on PostgreSQL: the worker half of
`ports.queue.RunQueuePort` (`queue.PgRunQueue` adds the run half), and the LISTEN loops.

A worker registers with its run slots, renews its lease with a heartbeat set by the database's
`now()` (which also returns the runs the database says it holds, so it stops those it no longer
does), and is gone when it says so or its heartbeat is older than RLM_MCP_WORKER_LEASE_S. Every
lease is judged on the database's clock; this process's clock is compared with it only to warn
of a skew (`clock_skew_s`). Workers gone or silent for a day, with no run left, are forgotten.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable

import anyio

from rlm_mcp.ports.queue import Beat, LostWorker, QueueRules, SweepLook
from rlm_mcp.ports.runs import WorkerRef
from rlm_mcp.store.pg import queue_statements as sql
from rlm_mcp.store.pg.connect import Connection
from rlm_mcp.store.pg.db import Conn, Database

log = logging.getLogger("rlm_mcp.queue")

FORGET_AFTER_S = 86400.0
RECONNECT_S = 1.0
KEEPALIVE_S = 10.0
CONNECT_TIMEOUT_S = 10
# The longest a follower waits for its run's LISTEN (one round trip on a live connection).
FOLLOW_WAIT_S = 2.0


class Follows:
    """The run channels (`queue_statements.run_channel`) a replica's runs listener is to LISTEN
    to: the runs it follows. Changed by the followers (`follow`, `forget`), applied by the loop
    (`listen_forever`) between two waits: a new channel interrupts the wait, and the LISTEN goes
    out at once; a forgotten one is left until the next LISTEN goes out (an ended run announces
    nothing more), so following a run costs one statement, not two. A follower waits for its
    LISTEN (`follow`'s event) while the listener is connected: what is announced after that
    reaches it; while the listener is not, its reconnect LISTENs to every run followed before it
    wakes every follower (`on_connect`), which then reads the row. A ping (`ping`) asks the loop
    for one round trip on its session, which also interrupts the wait: answered, the session was
    alive and every announcement committed before it has been heard."""

    def __init__(self) -> None:
        self.wanted: set[str] = set()
        self.listened: set[str] = set()  # on the listener's current connection
        self.waiting: anyio.CancelScope | None = None  # the loop's wait, while it waits
        self.interrupted = False
        self.connected = False  # the listener's connection is up and its LISTENs are applied
        self._settled: dict[str, anyio.Event] = {}  # set once the channel's LISTEN is in place
        self._ping: _Ping | None = None  # asked for, not answered yet

    def ping(self) -> _Ping | None:
        """Ask for a round trip on the listener's session (one at a time; None: no listener is
        connected, nothing to ask)."""
        if not self.connected:
            return None
        if self._ping is None:
            self._ping = _Ping()
            if self.waiting is not None:
                self.interrupted = True
                self.waiting.cancel()
        return self._ping

    def ping_wanted(self) -> bool:
        return self._ping is not None

    def pinged(self) -> None:
        """The ping's round trip was answered on a live session."""
        if self._ping is not None:
            self._ping.answered = True
            self._ping.done.set()
            self._ping = None

    def follow(self, channel: str) -> anyio.Event | None:
        """Want the channel; the event to wait for until its LISTEN is in place (None: it is,
        or no listener is connected)."""
        self.wanted.add(channel)
        if channel in self.listened or not self.connected:
            return None
        event = self._settled.get(channel)
        if event is None:
            event = self._settled[channel] = anyio.Event()
            if self.waiting is not None:
                self.interrupted = True
                self.waiting.cancel()
        return event

    def forget(self, channel: str) -> None:
        self.wanted.discard(channel)

    def changes(self) -> tuple[str, set[str]] | None:
        """The statement that brings the connection to `wanted` (None while nothing new is
        wanted), and what it listens to then."""
        new = self.wanted - self.listened
        if not new:
            return None
        commands = [sql.LISTEN.format(channel=c) for c in sorted(new)]
        commands += [sql.UNLISTEN.format(channel=c) for c in sorted(self.listened - self.wanted)]
        return "; ".join(commands), set(self.wanted)

    def applied(self, listened: set[str]) -> None:
        """The connection LISTENs to `listened` now: their followers go on."""
        self.listened = listened
        for channel in [c for c in self._settled if c in listened or c not in self.wanted]:
            self._settled.pop(channel).set()

    def disconnected(self) -> None:
        """The connection is gone: nothing is listened to, and no follower waits for it."""
        self.connected = False
        self.listened = set()
        for event in self._settled.values():
            event.set()
        self._settled.clear()
        if self._ping is not None:  # not answered: its asker's runs read their rows
            self._ping.done.set()
            self._ping = None


class _Ping:
    """A round trip asked of the runs listener (`Follows.ping`): `done` once it is over,
    `answered` when the session answered it."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.answered = False


class PgWorkerRegistry:
    """The workers of the team database: registration, heartbeats, leases."""

    def __init__(self, rules: QueueRules, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        """`clock`: this process's clock, compared with the database's only to warn of a skew."""
        self._clock = clock
        self._rules = rules
        self._db = db
        self._lease = rules.lease_s
        self._follows = Follows()  # the runs this process follows: their channels

    async def live_workers(self) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.LIVE_WORKERS, {"lease": self._lease})
            row = await cur.fetchone()
        return int(row["n"]) if row else 0

    async def register_worker(self, owner_id: str, slots: int) -> int:
        async with self._db.transaction() as conn:
            # This owner's earlier registrations (declared lost during an outage) are over: their
            # sandboxes are this process's own and must not be reaped as a lost worker's.
            await conn.execute(sql.RETIRE_OWNER, {"owner_id": owner_id})
            cur = await conn.execute(
                sql.REGISTER, {"owner_id": owner_id, "host": socket.gethostname(), "pid": os.getpid(), "slots": slots}
            )
            row = await cur.fetchone()
            assert row is not None
            await conn.execute(sql.NOTIFY_QUEUED, {"queue_channel": sql.QUEUE_CHANNEL})  # more slots: look again
        return int(row["worker_id"])

    async def unregister_worker(self, worker_id: int) -> None:
        # A stopping process's statement: on a connection of its own (`Database.parting_connection`).
        async with self._db.parting_connection() as conn:
            await conn.execute(sql.MARK_GONE, {"worker": worker_id})

    async def heartbeat(self, worker_id: int) -> Beat:
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.HEARTBEAT, {"worker": worker_id})
            row = await cur.fetchone()
        assert row is not None
        held = row["held"] if not isinstance(row["held"], str) else json.loads(row["held"])
        return Beat(bool(row["registered"]), {str(r[0]): (int(r[1]), bool(r[2])) for r in held})

    async def worker_ref(self, worker_id: int | None) -> WorkerRef:
        """A worker as notices name it: its id, host and pid (its id alone when its row is gone)."""
        async with self._db.connection() as conn:
            return await self._worker_ref(conn, worker_id)

    async def _worker_ref(self, conn: Conn, worker_id: int | None) -> WorkerRef:
        if worker_id is None:
            return WorkerRef()
        cur = await conn.execute(sql.WORKER_ROW, {"worker": worker_id})
        row = await cur.fetchone()
        if row is None:
            return WorkerRef(worker_id=worker_id)
        return WorkerRef(worker_id=worker_id, host=row["host"], pid=row["pid"])

    async def sweep_look(self) -> SweepLook:
        """What a sweep reads, in one round trip: seconds until the oldest live worker's lease
        ends (or None) and since the database started, by its own clock; the runs of workers past
        their lease; the registered workers past it, and the owners of those within it."""
        async with self._db.connection() as conn:
            cur = await conn.execute(sql.SWEEP_LOOK, {"lease": self._lease})
            row = await cur.fetchone()
        assert row is not None
        lost_runs, rows = (json.loads(row[k]) if isinstance(row[k], str) else row[k] for k in ("lost_runs", "workers"))
        live = {owner for _, owner, _, is_live in rows if is_live}
        return SweepLook(
            oldest_s=None if row["oldest_s"] is None else float(row["oldest_s"]),
            up_s=float(row["up_s"]),
            lost_runs=[str(r) for r in lost_runs],
            lost_workers=[LostWorker(int(i), owner, host) for i, owner, host, _ in rows if owner not in live],
            live_owners=live,
        )

    async def forget_old_workers(self) -> None:
        """Keep `rlm_workers` small: workers gone or silent for a day, with no run left."""
        async with self._db.connection() as conn:
            await conn.execute(sql.FORGET_WORKERS, {"after": FORGET_AFTER_S})

    async def mark_gone(self, worker_id: int) -> None:
        async with self._db.connection() as conn:
            await conn.execute(sql.MARK_GONE, {"worker": worker_id})

    async def clock_skew_s(self) -> float:
        """This process's clock minus the database's (seconds), halfway through the round trip."""
        async with self._db.connection() as conn:
            before = self._clock()
            cur = await conn.execute(sql.DB_CLOCK)
            row = await cur.fetchone()
            after = self._clock()
        assert row is not None
        return (before + after) / 2 - float(row["t"])

    # --- wake-ups -------------------------------------------------------------------------

    async def listen_runs(self, on_note: Callable[[str], None], *, on_connect: Callable[[], object]) -> None:
        """The announcements of the runs followed here (`follow_run`: each run's own channel), and
        those of an earlier version's workers (`queue_statements.CHANNEL`); never returns."""
        await listen_forever(self._db.url, sql.CHANNEL, on_note, on_connect=on_connect, follows=self._follows)

    async def follow_run(self, run_id: str) -> None:
        """Hear `run_id`'s announcements from now on (`listen_runs`): returns once its LISTEN is
        in place (or at once while the listener is not connected: its reconnect wakes every
        follower). Bounded: a listener stuck on a dead connection delays no caller past
        `FOLLOW_WAIT_S` (the follower's row poll covers what it then misses)."""
        event = self._follows.follow(sql.run_channel(run_id))
        if event is not None:
            with anyio.move_on_after(FOLLOW_WAIT_S):
                await event.wait()

    def forget_run(self, run_id: str) -> None:
        self._follows.forget(sql.run_channel(run_id))

    async def listener_alive(self, within_s: float) -> bool:
        """One round trip on the runs listener's session (`listen_runs`), answered within
        `within_s`: True when it was, so every announcement committed before it has been heard
        (PostgreSQL delivers a session's notifications ahead of a later statement's answer)."""
        ping = self._follows.ping()
        if ping is None:
            return False
        with anyio.move_on_after(within_s):
            await ping.done.wait()
        return ping.answered

    async def listen_queue(
        self, on_note: Callable[[str], None], *, on_connect: Callable[[], object], on_disconnect: Callable[[], object]
    ) -> None:
        """The workers' wake-ups (`queue_statements.QUEUE_CHANNEL`); never returns."""
        await listen_forever(
            self._db.url, sql.QUEUE_CHANNEL, on_note, on_connect=on_connect, on_disconnect=on_disconnect
        )


async def listen_forever(
    url: str,
    channel: str,
    on_note: Callable[[str], None],
    *,
    on_connect: Callable[[], object],
    on_disconnect: Callable[[], object] | None = None,
    follows: Follows | None = None,
) -> None:
    """LISTEN on `channel` over one connection of its own (not the pool's: it stays open),
    calling `on_note` with each payload, `on_connect` after each (re)connect and `on_disconnect`
    when a connection `on_connect` announced ends (found dead, or the loop cancelled); never
    returns.

    The loop sleeps on the connection's socket until the server sends something (or the
    keep-alive is due), then takes what arrived from libpq at once (`consume_input`, then each
    notification). psycopg's own `notifies(timeout=...)` wakes every 0.1 s to look for an
    interrupt: with a listener or three per replica that was most of an idle team's CPU; and
    even with no timeout, its async generator, lock and wait cost more per wake-up than the
    two libpq calls, and every replica wakes for every run's announcement.
    Nothing is lost between the two steps: the socket stays readable until its data is read,
    and what arrives during the keep-alive's statement psycopg keeps for `notifies(timeout=0)`,
    which drains it after that statement.

    `follows`: more channels, which change while it listens (the runs a front follows): each
    new one interrupts the wait and is LISTENed to before the next; after a reconnect, all. A
    ping it asks for (`Follows.ping`) interrupts the wait too."""
    while True:
        try:
            conn = await Connection.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            announced = False
            try:
                await _listen_first(conn, channel, follows)
                on_connect()
                announced = True
                pgconn, encoding = conn.pgconn, conn.info.encoding
                while True:
                    if follows is not None and await _follows_step(conn, follows, on_note):
                        continue  # runs followed (or a ping asked) meanwhile: before the wait
                    # No await from here to the wait: a run followed from now on interrupts it.
                    with anyio.move_on_after(KEEPALIVE_S) as quiet:
                        if follows is not None:
                            follows.waiting, follows.interrupted = quiet, False
                        try:
                            await anyio.wait_readable(pgconn.socket)
                        finally:
                            if follows is not None:
                                follows.waiting = None
                    if follows is not None and follows.interrupted:
                        continue  # a run to follow: its LISTEN first (the socket is looked at next)
                    if quiet.cancelled_caught:
                        await conn.execute(sql.PING)  # notices a dead connection
                        # What came during the statement, kept by psycopg (its backlog).
                        async for note in conn.notifies(timeout=0):
                            on_note(note.payload)
                        continue
                    pgconn.consume_input()  # raises on a dead connection: listen again
                    while (raw := pgconn.notifies()) is not None:
                        on_note(raw.extra.decode(encoding))
            finally:
                if follows is not None:
                    follows.disconnected()
                if announced and on_disconnect is not None:
                    on_disconnect()
                # Shielded: this loop ends by cancellation (its process stopping), and a close cut
                # short by it leaves the connection open until the collector finds it.
                with anyio.CancelScope(shield=True):
                    await conn.close()
        except Exception as exc:  # psycopg.Error, OSError: whatever it was, listen again
            log.info("the %s listener lost its connection (%s); reconnecting", channel, type(exc).__name__)
        await anyio.sleep(RECONNECT_S)


async def _follows_step(conn: Connection, follows: Follows, on_note: Callable[[str], None]) -> bool:
    """What the followers asked for since the last wait, one statement: the LISTENs of the runs
    followed meanwhile, else a ping (`Follows.ping`); False when they asked for nothing."""
    change = follows.changes()
    if change is None and not follows.ping_wanted():
        return False
    await conn.execute(change[0].encode() if change is not None else sql.PING)
    if change is not None:
        follows.applied(change[1])
    async for note in conn.notifies(timeout=0):  # what came during the statement, ahead of its answer
        on_note(note.payload)
    if change is None:
        follows.pinged()
    return True


async def _listen_first(conn: Connection, channel: str, follows: Follows | None) -> None:
    """A new session's LISTENs: the channel, and the runs followed already (before `on_connect`
    wakes their followers to read their rows: what is announced after a read reaches them)."""
    await conn.execute(sql.LISTEN.format(channel=channel).encode())
    if follows is not None:
        follows.listened = set()  # a new session listens to nothing else yet
        if (first := follows.changes()) is not None:
            await conn.execute(first[0].encode())
            follows.applied(first[1])
        follows.connected = True
