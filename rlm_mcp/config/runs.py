"""The runs and sessions sections: how many runs execute and wait, what is kept of them, and how
long a kept session lives."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlm_mcp.config.values import SECTION_CONFIG


class RunSettings(BaseModel):
    """RLM_MCP_ settings of run slots, the waiting queue and run records (`settings.runs`)."""

    model_config = SECTION_CONFIG

    max_runs: int = Field(4, ge=1, description="Runs executing at once; more wait (with progress).")
    max_runs_per_owner: int | None = Field(
        None,
        ge=1,
        description="Runs one owner (token) may have executing at once; more wait in the queue without taking a "
        "slot, so one token cannot hold every slot. Default: all of RLM_MCP_MAX_RUNS with one token (or stdio), "
        "half of them (rounded up) when several tokens are configured. Team mode applies the same share to "
        "the run slots of all live workers.",
    )
    run_queue_timeout_s: float = Field(60.0, description="How long a run waits for a free slot.")
    run_max_queued: int = Field(64, ge=0, description="Runs waiting for a slot, all owners; more are refused.")
    run_max_queued_per_owner: int = Field(
        16, ge=0, description="Runs one owner (token) may have waiting for a slot; more are refused."
    )
    run_max_records: int = Field(1000, ge=1, description="Finished run records kept on disk (newest first).")
    run_max_age_days: float = Field(30.0, description="Run records untouched this long are removed (0: never).")
    log_sub_call_chars: int = Field(
        2000, ge=0, description="Characters of each sub-call prompt and answer kept in the run log (head + tail)."
    )


class SessionSettings(BaseModel):
    """RLM_MCP_ settings of kept sessions (`settings.sessions`)."""

    model_config = SECTION_CONFIG

    session_idle_s: float = Field(
        900.0, gt=0, description="A kept session whose REPL sat idle this long is closed (its sandbox released)."
    )
    session_max_age_s: float = Field(86400.0, gt=0, description="A kept session ends this long after it started.")
    session_snapshot_max_bytes: int = Field(
        256 << 20,
        ge=0,
        description="Largest snapshot of a kept session's namespace; a bigger one is not kept (the session then "
        "ends when its sandbox is released). 0: no snapshots.",
    )
    session_snapshot_bytes_per_owner: int = Field(
        1 << 30,
        ge=0,
        description="Snapshot bytes one owner's kept sessions may hold together; a snapshot past it is not kept.",
    )
    session_prefer_worker_s: float = Field(
        2.0,
        ge=0,
        description="Team mode: how long a kept session's follow-up waits for the worker that holds its live "
        "sandbox before any worker may take it (restoring the session from its snapshot).",
    )
    session_snapshot_wait_s: float = Field(
        30.0,
        ge=0,
        description="Team mode: how long a follow-up waits for the snapshot taken after the session's previous "
        "run (in the background, once its result was out) before it goes on without it.",
    )
    max_sessions_per_owner: int = Field(4, ge=0, description="Kept sessions one owner (token) may hold open at once.")
