"""Connections to PostgreSQL whose abandoned attempts close their socket at once.

An attempt given up on mid handshake (its connect timeout, or a cancellation: the pool closing
while it grows or reconnects after an outage) must close its socket then. Otherwise the server's
backend for it waits in authentication until `authentication_timeout` (60 s by default): it holds
a connection slot, and a statement that waits for every backend to take note of it (DROP DATABASE,
for one) waits the whole minute. psycopg leaves the half-made libpq connection in the failed
attempt's frames, which the exception it raises keeps alive through its traceback (and which are
part of a reference cycle), so the socket closed only whenever the cycle collector ran.
`Connection.connect` clears those frames as the failure passes: the half-made connection is
released, and libpq closes its socket, before the caller sees the error.
"""

from __future__ import annotations

import traceback
from typing import Any, Self

import psycopg


class Connection(psycopg.AsyncConnection[Any]):
    """The pool's connection class (and the first connection's): psycopg's, but a failed or
    cancelled `connect` leaves no socket open behind it."""

    @classmethod
    async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        try:
            return await super().connect(conninfo, **kwargs)
        except BaseException as exc:
            # The frames the failure came through have returned; their locals (the attempt's
            # generator and its libpq connection) go now, not at the next cycle collection.
            traceback.clear_frames(exc.__traceback__)
            raise
