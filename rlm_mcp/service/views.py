"""What the service returns about a run, typed: its live or recorded status."""

from __future__ import annotations

from pydantic import BaseModel

from rlm_mcp.ports.runs import RunRecord, RunStatus, Usage, render_notices


class RunSnapshot(BaseModel):
    """A run's status at one moment (rlm_status, rlm_cancel, rlm_result while it runs)."""

    run_id: str
    status: RunStatus
    iterations: int | None = None
    max_iterations: int | None = None
    sub_calls: int | None = None
    usage: Usage | None = None
    elapsed_s: float | None = None
    # Team mode: why a queued run is not moving (no live worker), or which worker runs it.
    notice: str | None = None

    @classmethod
    def from_record(cls, record: RunRecord) -> RunSnapshot:
        """From a run's stored record (a run that ended, possibly in another server)."""
        return cls(
            run_id=record.run_id,
            status=record.status,
            iterations=record.iterations,
            max_iterations=record.max_iterations,
            sub_calls=record.sub_calls,
            usage=record.usage,
            elapsed_s=record.elapsed_s,
            notice=render_notices(record.notice),
        )
