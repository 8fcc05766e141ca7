"""What the RLM engine reads of the settings, derived once by the assembly (`EngineSettings`).

The engine's knobs sit in four sections (the LM's models and token caps, the loop's limits, the
sandbox's batch and output sizes, the run log's text cap); the engine takes this one frozen value
instead of the whole `Settings`, so what it depends on is written here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlm_mcp.config.lm import LMSettings
from rlm_mcp.config.loop import LoopSettings
from rlm_mcp.config.runs import RunSettings
from rlm_mcp.config.sandbox import SandboxSettings

__all__ = ["EngineSettings"]


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
            submit_on_max_iterations=loop.submit_on_max_iterations,
            output_chars=loop.output_chars,
            max_prompts_per_batch=sandbox.max_prompts_per_batch,
            cell_output_bytes=sandbox.cell_output_bytes,
            log_sub_call_chars=runs.log_sub_call_chars,
        )
