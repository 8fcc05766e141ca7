"""Owner liveness from the workers' leases: who may reap a stopped sandbox in team mode.

A worker's sandboxes carry its owner id (the `SandboxManager` owner label), which `rlm_workers`
ties to its worker row and so to its heartbeat (`rlm_workers.heartbeat_at`). The sweeper (`sweeper.py`) refreshes
the sets below from the database; `owner_gone` is called from a worker thread and only reads
them. An owner the database does not know (a server outside team mode on the same Docker host)
is judged by the single-host rule (`sandbox.liveness.ProcessLiveness`).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_mcp.sandbox.liveness import ProcessLiveness

LABEL_OWNER = "rlm-mcp.owner"


class LeaseLiveness:
    """`ports.owners.OwnerLiveness` backed by the workers' heartbeats in PostgreSQL."""

    def __init__(self) -> None:
        self._local = ProcessLiveness()
        self.live: frozenset[str] = frozenset()  # owner ids of workers within their lease
        self.lost: frozenset[str] = frozenset()  # owner ids of workers past their lease

    def stamp(self) -> Mapping[str, str]:
        return self._local.stamp()

    def owner_gone(self, labels: Mapping[str, str], *, idle_s: float) -> bool:
        owner = labels.get(LABEL_OWNER, "")
        if owner in self.live:
            return False
        if owner in self.lost:
            return True
        return self._local.owner_gone(labels, idle_s=idle_s)
