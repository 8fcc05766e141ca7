"""What the service reads of the settings itself (`ServiceSettings`), derived once by the assembly:
a run's default limits and the prompt profile (the loop section), the root model, where the
reference texts are kept (the data dir), and how a context over the limit is explained (the
sandbox's memory, when the limit follows it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlm_mcp.config.loop import LoopSettings

__all__ = ["ServiceSettings"]


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
