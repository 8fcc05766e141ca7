"""The host's bounds on sub-LM requests coming out of a sandbox (count, batch size, model)."""

from __future__ import annotations

from dataclasses import dataclass

from rlm_mcp.config import Settings

MAX_OUTSTANDING = 64  # lm_requests of one sandbox being answered at once


@dataclass
class Verdict:
    results: list[str] | None = None  # answer at once with these strings
    error: str | None = None  # or make the call raise in the sandbox with this message


class LMGate:
    """Counts one sandbox's sub-calls and decides which requests reach the bridge."""

    def __init__(self, settings: Settings) -> None:
        self.max_calls = settings.max_sub_calls_per_run
        self.max_batch = settings.max_prompts_per_batch
        self.allowed = {settings.model, settings.effective_sub_model}
        self.used = 0
        self.outstanding = 0
        self.refused = 0

    def check(self, prompts: list[str], model: str | None) -> Verdict | None:
        """None: forward to the bridge. Otherwise the immediate answer."""
        n = len(prompts)
        if n > self.max_batch:
            self.refused += 1
            return Verdict(error=f"a batched call may carry at most {self.max_batch} prompts (got {n}); split it")
        if model is not None and model not in self.allowed:
            self.refused += 1
            names = ", ".join(sorted(repr(m) for m in self.allowed))
            return Verdict(results=[f"Error: model {model[:100]!r} is not available here; use model=None or one of {names}."] * n)
        if self.used + n > self.max_calls:
            self.refused += 1
            return Verdict(
                results=[f"Error: this run has used its {self.max_calls} sub-LM calls (RLM_MCP_MAX_SUB_CALLS_PER_RUN); "
                         "work with what you have."] * n
            )
        if self.outstanding >= MAX_OUTSTANDING:
            self.refused += 1
            return Verdict(results=[f"Error: more than {MAX_OUTSTANDING} sub-LM requests at once; use llm_query_batched."] * n)
        self.used += n
        return None
