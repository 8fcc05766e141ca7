"""The host's bounds on sub-LM requests coming out of a sandbox: batch size and requests in
flight. These are input bounds (a hostile cell can flood the host); they are this module's alone.
What a request may do (which model, how many calls a run tree makes) is the engine's bridge's
rule (engine/bridge.py), applied to every request that passes here."""

from __future__ import annotations

from dataclasses import dataclass

from rlm_mcp.config import SandboxSettings

MAX_OUTSTANDING = 64  # lm_requests of one sandbox being answered at once


@dataclass
class Verdict:
    results: list[str] | None = None  # answer at once with these strings
    error: str | None = None  # or make the call raise in the sandbox with this message


class LMGate:
    """Decides which of one sandbox's sub-LM requests reach the bridge."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.max_batch = settings.max_prompts_per_batch
        self._outstanding = 0

    @property
    def outstanding(self) -> int:
        """Requests admitted and not yet released."""
        return self._outstanding

    def admit(self, prompts: list[str]) -> Verdict | None:
        """None: the request is admitted (forward it to the bridge, then `release` it, always).
        Otherwise the immediate answer, and nothing to release."""
        n = len(prompts)
        if n > self.max_batch:
            return Verdict(error=f"a batched call may carry at most {self.max_batch} prompts (got {n}); split it")
        if self._outstanding >= MAX_OUTSTANDING:
            return Verdict(
                results=[f"Error: more than {MAX_OUTSTANDING} sub-LM requests at once; use llm_query_batched."] * n
            )
        self._outstanding += 1
        return None

    def release(self) -> None:
        """An admitted request was answered (or cancelled)."""
        self._outstanding -= 1
