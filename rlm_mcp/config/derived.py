"""What cuts across sections, derived once from the settings as small frozen values for the
assembly to hand down (`settings.engine`, `.queue`, `.kept_sessions`, `.service`): a part below
the entry points takes its section, or one of these, never the whole `Settings`, so what it
depends on is written here and nowhere else. Each value keeps the settings' flat names.

- `EngineSettings`: what the RLM engine reads (the LM's models and token caps, the loop's
  limits, the sandbox's batch and output sizes, the run log's text cap).
- `QueueSettings`: what team mode's queue parts read (the front, the sweeper, the worker, the
  queue rules): the run slots and waiting bounds, the poll and the lease, and the tokens, each
  one an owner sharing the slots.
- `KeptSessionSettings`: what the kept sessions' managers read (the sessions section, where
  snapshots are spooled, the two sandbox limits a snapshot's size and deadline follow).
- `ServiceSettings`: what the service reads itself (a run's default limits and the prompt
  profile, the root model, where the reference texts are kept, how a context over the limit is
  explained).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlm_mcp.config.lm import LMSettings
from rlm_mcp.config.loop import LoopSettings
from rlm_mcp.config.publish import PublishSettings
from rlm_mcp.config.runs import RunSettings, SessionSettings
from rlm_mcp.config.sandbox import SandboxSettings
from rlm_mcp.config.server import ServerSettings
from rlm_mcp.config.store import StoreSettings
from rlm_mcp.config.team import TeamSettings

__all__ = ["EngineSettings", "KeptSessionSettings", "QueueSettings", "ServiceSettings"]


@dataclass(frozen=True)
class EngineSettings:
    """The engine's settings, each under its flat setting name (RLM_MCP_<NAME>)."""

    model: str
    effective_sub_model: str  # RLM_MCP_SUB_MODEL, or the root model when unset
    sandbox_models: frozenset[str]  # the models sandbox code may name in a sub-call
    root_max_tokens: int
    sub_max_tokens: int
    min_completion_tokens: int
    max_sub_calls_per_run: int
    max_concurrent_children: int
    max_concurrent_lm_calls: int  # the LM client's slots: a sub-call batch's width (engine/bridge.py)
    submit_on_max_iterations: bool
    output_chars: int
    max_prompts_per_batch: int
    cell_output_bytes: int
    log_sub_call_chars: int

    @classmethod
    def of(cls, lm: LMSettings, loop: LoopSettings, sandbox: SandboxSettings, runs: RunSettings) -> EngineSettings:
        return cls(
            model=lm.model,
            effective_sub_model=lm.effective_sub_model,
            sandbox_models=frozenset(lm.sandbox_models),
            root_max_tokens=lm.root_max_tokens,
            sub_max_tokens=lm.sub_max_tokens,
            min_completion_tokens=lm.min_completion_tokens,
            max_sub_calls_per_run=lm.max_sub_calls_per_run,
            max_concurrent_children=loop.max_concurrent_children,
            max_concurrent_lm_calls=lm.max_concurrent_lm_calls,
            submit_on_max_iterations=loop.submit_on_max_iterations,
            output_chars=loop.output_chars,
            max_prompts_per_batch=sandbox.max_prompts_per_batch,
            cell_output_bytes=sandbox.cell_output_bytes,
            log_sub_call_chars=runs.log_sub_call_chars,
        )


@dataclass(frozen=True)
class QueueSettings:
    runs: RunSettings
    team: TeamSettings
    server: ServerSettings
    publish: PublishSettings

    @property
    def queue_poll_s(self) -> float:
        return self.team.queue_poll_s

    @property
    def queue_idle_poll_s(self) -> float:
        """Never shorter than the poll interval."""
        return max(self.team.queue_idle_poll_s, self.team.queue_poll_s)

    @property
    def worker_lease_s(self) -> float:
        return self.team.worker_lease_s

    @property
    def queue_local_first(self) -> bool:
        return self.team.queue_local_first

    @property
    def run_queue_timeout_s(self) -> float:
        return self.runs.run_queue_timeout_s

    @property
    def max_runs(self) -> int:
        return self.runs.max_runs


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


@dataclass(frozen=True)
class ServiceSettings:
    loop: LoopSettings
    model: str  # RLM_MCP_MODEL
    data_dir: Path  # RLM_MCP_DATA_DIR
    sandbox_memory: str  # RLM_MCP_SANDBOX_MEMORY
    # RLM_MCP_MAX_CONTEXT_BYTES was derived from RLM_MCP_SANDBOX_MEMORY: a refusal names the memory.
    context_limit_follows_memory: bool

    @property
    def prompt_profile(self) -> str:
        return self.loop.prompt_profile

    @property
    def reference_fetch(self) -> bool:
        return self.loop.reference_fetch
