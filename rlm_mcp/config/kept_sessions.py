"""What the kept sessions' managers read of the settings (`KeptSessionSettings`), derived once by
the assembly: the sessions section, where their snapshots are spooled (the data dir, the store
section's), and the two sandbox limits a snapshot's size and deadline follow."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlm_mcp.config.runs import SessionSettings
from rlm_mcp.config.sandbox import SandboxSettings
from rlm_mcp.config.store import StoreSettings

__all__ = ["KeptSessionSettings"]


@dataclass(frozen=True)
class KeptSessionSettings:
    """Each value under its flat setting name (RLM_MCP_<NAME>)."""

    data_dir: Path
    max_sessions_per_owner: int
    session_idle_s: float
    session_max_age_s: float
    session_snapshot_max_bytes: int
    session_snapshot_bytes_per_owner: int
    session_snapshot_wait_s: float
    cell_output_bytes: int  # a snapshot crosses in pieces under the cell-output cap
    cell_timeout_s: float  # the snapshot's cell may run as long as any cell

    @classmethod
    def of(cls, sessions: SessionSettings, store: StoreSettings, sandbox: SandboxSettings) -> KeptSessionSettings:
        return cls(
            data_dir=store.data_dir,
            max_sessions_per_owner=sessions.max_sessions_per_owner,
            session_idle_s=sessions.session_idle_s,
            session_max_age_s=sessions.session_max_age_s,
            session_snapshot_max_bytes=sessions.session_snapshot_max_bytes,
            session_snapshot_bytes_per_owner=sessions.session_snapshot_bytes_per_owner,
            session_snapshot_wait_s=sessions.session_snapshot_wait_s,
            cell_output_bytes=sandbox.cell_output_bytes,
            cell_timeout_s=sandbox.cell_timeout_s,
        )
