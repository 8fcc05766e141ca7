"""What the service returns about a run, typed: its live or recorded status; and the usage a
kept session shows, summed from its runs' records."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from pydantic import BaseModel

from rlm_mcp.errors import NotFoundError
from rlm_mcp.ports.runs import LiveState, Notice, RunRecord, RunResult, RunStatus, Usage, render_notices, summed_usage
from rlm_mcp.ports.sessions import SAVING

# The live state's fields a snapshot shows as they are (its notice it shows rendered).
_LIVE_COUNTERS = ("status", "iterations", "max_iterations", "sub_calls", "usage", "elapsed_s")


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
    # Why a finished run ended as it did (the result's reason), so rlm_status says it too.
    reason: str | None = None

    @classmethod
    def of(
        cls, run_id: str, live: LiveState, result: RunResult | None, *, waiting: Notice | None = None
    ) -> RunSnapshot:
        """From a run's live state (`ports.runs.LiveState`: a running run's, or its record's),
        with the result's reason once it ended; `waiting`: the front's own notice, said after
        the record's."""
        return cls(
            run_id=run_id,
            **{name: getattr(live, name) for name in _LIVE_COUNTERS},
            notice=render_notices(live.notice, waiting),
            reason=result.reason if result is not None else None,
        )

    @classmethod
    def from_record(cls, record: RunRecord) -> RunSnapshot:
        """From a run's stored record (a run that ended, possibly in another server)."""
        return cls.of(record.run_id, record, record.result)


async def session_usage(run_ids: Iterable[str], read: Callable[[str], Awaitable[RunRecord]]) -> Usage:
    """The tokens, cached tokens, calls and cost (where the price table prices the model) of a
    kept session's runs together, read from the run records, which every store keeps, so it is
    the same whichever process ran each run; a record already deleted (RLM_MCP_RUN_MAX_RECORDS)
    counts nothing."""
    records = []
    for run_id in dict.fromkeys(run_ids):
        try:
            records.append(await read(run_id))
        except NotFoundError:
            continue
    return summed_usage(records)


async def with_session_usage(
    described: dict[str, object], read: Callable[[str], Awaitable[RunRecord]]
) -> dict[str, object]:
    """A kept session as `rlm_list_sessions` shows it, with `usage` (`session_usage`) of its
    runs, the one going included."""
    listed = described.get("runs")
    run_ids = [r for r in listed if isinstance(r, str)] if isinstance(listed, list) else []
    running = described.get("running")
    if isinstance(running, str) and running != SAVING:
        run_ids.append(running)
    return {**described, "usage": (await session_usage(run_ids, read)).to_dict()}
