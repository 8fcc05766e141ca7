"""Per-run limits a caller may override: the one model of their names, ranges and meaning.

The server declares its tool parameters with these annotated types (so the JSON schema shows
the same ranges), the service validates with `RunOverrides`, and the CLI builds one too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlm_mcp.config import LoopSettings
from rlm_mcp.errors import BadArgumentError

if TYPE_CHECKING:
    from rlm_mcp.engine import RunLimits

MaxIterations = Annotated[int | None, Field(ge=1, le=200, description="Root turns (default 20).")]
MaxDepth = Annotated[int | None, Field(ge=1, le=5, description="1: rlm_query is a plain sub-call; 2+: child RLMs.")]
TimeoutS = Annotated[float | None, Field(ge=1, le=86_400, description="Wall-clock limit of the run in seconds.")]
TokenBudget = Annotated[int | None, Field(ge=1, le=10**12, description="Tokens the whole run tree may spend.")]

RESULT_WAIT_MAX_S = 300  # the longest one rlm_result call waits for a run to end
WaitS = Annotated[float, Field(ge=0, le=RESULT_WAIT_MAX_S, description="Wait up to this long for the end.")]


class RunOverrides(BaseModel):
    """The caller's limits for one run; None means the setting's value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_iterations: MaxIterations = None
    max_depth: MaxDepth = None
    timeout_s: TimeoutS = None
    token_budget: TokenBudget = None

    @classmethod
    def checked(cls, **values: object) -> RunOverrides:
        """Validate values from a caller that has no schema of its own (the CLI, Python use)."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ".".join(str(part) for part in first["loc"])
            raise BadArgumentError(
                f"{name}={first.get('input')!r} is not accepted: {first['msg']}.",
                "See the limits in `rlm-mcp run --help` or the tool's schema.",
            ) from exc

    def limits(self, settings: LoopSettings) -> RunLimits:
        """The run's limits: these values where given, the settings' otherwise."""
        # The engine package loads its whole loop: imported here, not by the CLI's parser (start-up time).
        from rlm_mcp.engine import RunLimits

        return RunLimits(
            max_iterations=self.max_iterations if self.max_iterations is not None else settings.max_iterations,
            max_depth=self.max_depth if self.max_depth is not None else settings.max_depth,
            timeout_s=float(self.timeout_s if self.timeout_s is not None else settings.timeout_s),
            token_budget=self.token_budget if self.token_budget is not None else settings.token_budget,
            max_errors=settings.max_errors,
        )
