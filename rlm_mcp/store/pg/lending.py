"""When a pool lends a connection without psycopg_pool's check, and whether the database answered lately.

psycopg 3's async pool checks a connection before lending it (`check_connection`: an empty query,
a round trip) unless `Lending.check` says it need not: the connection came back healthy within
`QUIET_S` and its socket has nothing to read (`quiet`). On an idle replica every timer's statement
paid that round trip, a third of its round trips, and a busy pool's too (it lends the least
recently returned connection first). A server that ends a session (a restart, a shutdown,
`pg_terminate_backend`, its process killed) says so on the socket (an error message, or the
kernel's end of stream), which makes it readable: such a connection gets the full check, fails it
and is replaced. What the socket cannot show is a peer gone silently (a host lost, a middlebox that
forgot the connection): those take minutes of idleness (NAT and load-balancer idle timeouts), past
`QUIET_S`, after which the round trip is made again. After any failed statement every connection is
checked again (`failed`), so the calls after a PostgreSQL restart succeed (the first one during it
fails, as it would anyway).

A statement answered within `ANSWERED_S` (any connection given back healthy, by any pool sharing
the `Answers`) is the health route's answer, without a `SELECT 1` of its own: HAProxy asks every
2 s, so an idle replica pings every other check and a busy one never. A failure forgets it at once.
"""

from __future__ import annotations

import select
import time
import weakref

import psycopg
from psycopg_pool import AsyncConnectionPool

from rlm_mcp.store.pg.reads import Conn

__all__ = ["ANSWERED_S", "QUIET_S", "Answers", "Lending", "quiet"]

QUIET_S = 60.0
ANSWERED_S = 2.5


def quiet(conn: Conn) -> bool:
    """Whether the connection's socket has nothing to read, looked at without waiting: an idle
    session's server sends nothing unless it ends it (or, rarely, a notice; the full check then)."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:  # closed, or no socket
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


class Answers:
    """When a connection last came back healthy from the pools sharing it (one process's pools on
    one database); -inf after a failure or a close: the health route's `SELECT 1` until then."""

    def __init__(self) -> None:
        self.at = float("-inf")


class Lending:
    """One pool's record of its connections' healthy returns, and the check it lends them by."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self._returned_at: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()

    def returned(self, conn: Conn) -> None:
        """A lent connection came back in working order (not broken): lent unchecked for a while."""
        if not conn.broken:
            self._returned_at[conn] = self.answers.at = time.monotonic()

    async def check(self, conn: Conn) -> None:
        """The pool's `check` callback: the round trip only when the connection may be stale."""
        idle = time.monotonic() - self._returned_at.get(conn, float("-inf"))
        if idle < QUIET_S and quiet(conn):
            return
        await AsyncConnectionPool.check_connection(conn)

    def failed(self) -> None:
        """A statement failed on a connection: check every other before lending it, and let the
        health route ask the database."""
        self._returned_at.clear()
        self.closed()

    def closed(self) -> None:
        self.answers.at = float("-inf")  # nothing answers any more

    def answered_lately(self) -> bool:
        return time.monotonic() - self.answers.at < ANSWERED_S
