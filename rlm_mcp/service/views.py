"""What the service returns about a run, typed: its live or recorded status."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from rlm_mcp.engine import RunStatus


class RunSnapshot(BaseModel):
    """A run's status at one moment (rlm_status, rlm_cancel, rlm_result while it runs)."""

    run_id: str
    status: RunStatus
    iterations: int | None = None
    max_iterations: int | None = None
    sub_calls: int | None = None
    usage: dict[str, Any] | None = None
    elapsed_s: float | None = None
    # Team mode: why a queued run is not moving (no live worker), or which worker runs it.
    notice: str | None = None

    @classmethod
    def from_record(cls, summary: dict[str, Any]) -> RunSnapshot:
        """From a run record on disk (a run that ended, possibly in another server)."""
        return cls.model_validate({name: summary.get(name) for name in cls.model_fields})
