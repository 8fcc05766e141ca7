"""What the queue derives from a run's record: its request, its sandbox need, its final record
when it ends without its worker, and each owner's share of all live workers' run slots (the
rule is `service.run_queue.owner_run_share`, the same as embedded mode's, applied to the slots
of every live worker; enforced at claim time, `state.PgRunQueue.claim`).
"""

from __future__ import annotations

from typing import Any

from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.runs import Notice, NotStarted, RunRecord, RunRequest, RunStatus


def request_of(summary: dict[str, Any]) -> RunRequest:
    """The request a stored run record carries (the queue row holds the record, nothing else)."""
    return RunRecord.from_stored(summary).request


def need_of(request: RunRequest) -> int:
    """Sandbox slots a run may hold at once: one per depth of its tree (`sandbox/slots.py`); a
    worker with fewer slots in all claims it when all of its slots are free."""
    return max(1, request.limits.max_depth)


def final_summary(summary: dict[str, Any], status: RunStatus, reason: str | Notice) -> RunRecord:
    """A run's last stored record turned final, for a run that ends without its worker."""
    notice = reason if isinstance(reason, Notice) else None
    text = reason.render() if isinstance(reason, Notice) else reason
    return RunRecord.from_stored(summary).ended(status, text, notice=notice)


def not_started(summary: dict[str, Any], cause: RlmMcpError) -> RunRecord:
    """The final record of a claimed run that could not start (its kept session ended): its
    waiting `rlm_complete` raises `cause` as a tool error."""
    record = RunRecord.from_stored(summary).ended("error", str(cause))
    return record.model_copy(update={"not_started": NotStarted(cause=cause.cause, fix=cause.fix)})
