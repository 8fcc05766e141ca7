"""Owner liveness on one host: a sandbox is reaped only when the process that made it is gone.

Each sandbox carries its creator's hostname, pid and process start time (the start time tells a
reused pid apart). On the same host the owner is gone when no process has that pid and start
time; a sandbox from another host, or from a version without these labels, is judged gone only
after it has been stopped for `FOREIGN_GRACE_S` (its owner cannot be asked).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping

LABEL_HOST = "rlm-mcp.owner.host"
LABEL_PID = "rlm-mcp.owner.pid"
LABEL_STARTED = "rlm-mcp.owner.started"
FOREIGN_GRACE_S = 3600.0


def process_started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), "" where the platform
    does not say, None when no process has this pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # no such process, or /proc hides other users' (hidepid), or no /proc
        return _exists_or_none(pid)
    # The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) > 19 and fields[0] != b"Z":  # a zombie has already exited
        return fields[19].decode()
    return None


def _exists_or_none(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return ""  # someone else's process: it exists
    return ""


@functools.cache
def _own_stamp() -> dict[str, str]:
    pid = os.getpid()
    return {LABEL_HOST: socket.gethostname(), LABEL_PID: str(pid), LABEL_STARTED: process_started(pid) or ""}


class ProcessLiveness:
    """`ports.owners.OwnerLiveness` for servers that share one host (and its container engine)."""

    def __init__(self, *, foreign_grace_s: float = FOREIGN_GRACE_S) -> None:
        self.foreign_grace_s = foreign_grace_s

    def stamp(self) -> Mapping[str, str]:
        # Computed per process: a forked child has its own pid and start time.
        own = _own_stamp()
        if own[LABEL_PID] != str(os.getpid()):
            _own_stamp.cache_clear()
            own = _own_stamp()
        return dict(own)

    def owner_gone(self, labels: Mapping[str, str], *, idle_s: float) -> bool:
        host, pid = labels.get(LABEL_HOST), labels.get(LABEL_PID, "")
        if host != socket.gethostname() or not pid.isdigit():
            return idle_s >= self.foreign_grace_s
        started = process_started(int(pid))
        if started is None:
            return True
        recorded = labels.get(LABEL_STARTED, "")
        # Same pid, other start time: the owner exited and the pid was reused.
        return bool(recorded and started and recorded != started)
