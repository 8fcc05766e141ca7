"""How many runs may wait for a slot.

Runs beyond RLM_MCP_MAX_RUNS wait in a queue; unbounded, 1,100 `rlm_start` calls held 1,100
run logs open and exhausted a 1,024-fd server. The queue is bounded overall
(RLM_MCP_RUN_MAX_QUEUED) and per owner (RLM_MCP_RUN_MAX_QUEUED_PER_OWNER, so one token cannot
fill it for the others); a run over either bound is refused at once, before anything is opened,
with an error that speaks only of the caller's own runs or of the server as a whole.
"""

from __future__ import annotations

from rlm_mcp.config import Settings
from rlm_mcp.errors import BusyError

__all__ = ["queue_refusal"]


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def queue_refusal(settings: Settings, *, queued: int, queued_by_owner: int) -> BusyError | None:
    """The busy error for one more queued run, or None when there is room."""
    if queued_by_owner >= settings.run_max_queued_per_owner:
        return BusyError(
            f"You already have {_runs(queued_by_owner)} waiting for a slot "
            f"(RLM_MCP_RUN_MAX_QUEUED_PER_OWNER={settings.run_max_queued_per_owner}).",
            "Wait for one to start or end (rlm_status), or cancel one (rlm_cancel).",
        )
    if queued >= settings.run_max_queued:
        return BusyError(
            f"The server's queue is full: {_runs(queued)} waiting for a slot (RLM_MCP_RUN_MAX_QUEUED).",
            "Try again in a while; the operator can raise RLM_MCP_RUN_MAX_QUEUED or RLM_MCP_MAX_RUNS.",
        )
    return None
