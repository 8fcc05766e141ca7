"""Who may reap a sandbox: the owner-liveness port (docs/architecture.md, "Reaping").

Several servers share one container engine. Each labels what it creates with a stamp naming
itself; at start-up a server removes the stopped sandboxes whose owner is certainly gone, and
never a live neighbour's (that neighbour may still be reading its container's exit reason).
One host: the stamp is hostname, pid and process start time (`sandbox.liveness`). Team mode
implements the same protocol with its database leases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class OwnerLiveness(Protocol):
    """Stamps this process's sandboxes and judges whether another sandbox's owner is gone."""

    def stamp(self) -> Mapping[str, str]:
        """Labels naming this process as the owner of a sandbox it creates."""
        ...

    def owner_gone(self, labels: Mapping[str, str], *, idle_s: float) -> bool:
        """True only when the owner named by `labels` is certainly gone (or, when that cannot
        be known, has left the sandbox stopped for longer than a grace period). `idle_s`: how
        long the sandbox has been stopped (or, never started, how long since it was created)."""
        ...
