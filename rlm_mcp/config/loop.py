"""The loop section: how one RLM run proceeds (its prompt, turns, depth, limits, output shown)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from rlm_mcp.config.values import SECTION_CONFIG
from rlm_mcp.prompt_file import MAX_PROMPT_BYTES, PromptFileError, prompt_file_path, read_prompt_file


class LoopSettings(BaseModel):
    """RLM_MCP_ settings of the RLM loop (`settings.loop`)."""

    model_config = SECTION_CONFIG

    prompt_profile: str = Field(
        "auto", description="auto (canonical for the adapter, else rlm-mcp) | canonical | rlm-mcp | file:PATH"
    )
    reference_fetch: bool = Field(
        True, description="auto/canonical: fetch the pinned reference wheel (rlms 0.1.3) once when it is missing."
    )
    max_iterations: int = Field(20, ge=1, le=200, description="Root turns per run.")
    max_depth: int = Field(1, ge=1, le=5, description="Recursion depth; 1 means rlm_query is llm_query.")
    max_concurrent_children: int = Field(4, ge=1, description="Child RLMs one run tree runs at once, per depth.")
    timeout_s: float = Field(900.0, gt=0, description="Wall-clock limit of one run.")
    token_budget: int | None = Field(None, description="Tokens (prompt+completion) one run tree may spend.")
    max_errors: int = Field(5, ge=1, description="Consecutive cells that raised before the run ends.")
    submit_on_max_iterations: bool = Field(True, description="One extra 'submit now' turn at max_iterations.")
    output_chars: int = Field(20_000, description="Characters of each block's output shown to the model.")
    answer_max_chars: int = Field(20_000, description="Answer characters in a tool result (full: resource).")

    @field_validator("prompt_profile", mode="after")
    @classmethod
    def _check_prompt_file(cls, value: str) -> str:
        path = prompt_file_path(value)
        if path is not None:
            try:
                read_prompt_file(path)  # at start, not at the first run
            except PromptFileError as exc:
                raise ValueError(f"{exc}; give a regular UTF-8 text file of at most {MAX_PROMPT_BYTES} bytes") from None
        return value
