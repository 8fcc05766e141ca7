"""What the queue derives from a run's record: its sandbox need, and its final record when it
could not start."""

from __future__ import annotations

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.runs import NotStarted, RunRecord, RunRequest


def need_of(request: RunRequest) -> int:
    """Sandbox slots a run may hold at once: one per depth of its tree (`sandbox/slots.py`); a
    worker with fewer slots in all claims it when all of its slots are free."""
    return max(1, request.limits.max_depth)


def not_started(summary: RunRecord, cause: RlmMcpError) -> RunRecord:
    """The final record of a claimed run that could not start (its kept session ended): its
    waiting `rlm_complete` raises `cause` as a tool error."""
    record = summary.ended("error", str(cause))
    return record.model_copy(update={"not_started": NotStarted(cause=cause.cause, fix=cause.fix)})
