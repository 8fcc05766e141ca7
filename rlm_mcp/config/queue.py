"""What team mode's run queue reads of the settings (`QueueSettings`), derived once by the assembly.

The queue's parts (the front, the sweeper, the worker, the rules both queue implementations
apply) read three sections: the run slots and waiting bounds (`runs`), the poll and the lease
(`team`), and the tokens, each one an owner sharing the slots (`server`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlm_mcp.config.runs import RunSettings
from rlm_mcp.config.server import ServerSettings
from rlm_mcp.config.team import TeamSettings

__all__ = ["QueueSettings"]


@dataclass(frozen=True)
class QueueSettings:
    runs: RunSettings
    team: TeamSettings
    server: ServerSettings

    @property
    def queue_poll_s(self) -> float:
        return self.team.queue_poll_s

    @property
    def worker_lease_s(self) -> float:
        return self.team.worker_lease_s

    @property
    def run_queue_timeout_s(self) -> float:
        return self.runs.run_queue_timeout_s

    @property
    def max_runs(self) -> int:
        return self.runs.max_runs
