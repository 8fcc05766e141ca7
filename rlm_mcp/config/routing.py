"""The routing section: what rlm-mcp tells the replica routers in front of its LM endpoints
(session-count-aware affinity, program hints) and how it adapts its load to their answers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlm_mcp.config.values import SECTION_CONFIG


class RoutingSettings(BaseModel):
    """RLM_MCP_ settings of routing and back-pressure (`settings.routing`)."""

    model_config = SECTION_CONFIG

    router_sessions: bool = Field(
        False,
        description=(
            "The endpoints are routers that count sessions (vllm-router --policy sticky_least_loaded): "
            "sub-calls key on a few sessions per run instead of one per request, and each run's sessions "
            "are ended with POST /finish_session when the run ends (root calls key on the run only with "
            "session_affinity, the default)."
        ),
    )
    router_sub_sessions: int = Field(
        4, ge=1, le=64, description="With router_sessions: the sessions one run tree's sub-calls spread over."
    )
    router_api_key: str | None = Field(
        None,
        description=(
            "With router_sessions: the key /finish_session is sent with (Bearer), when the router's differs "
            "from the endpoint's key (RLM_MCP_API_KEY, RLM_MCP_SUB_API_KEY), which is sent otherwise."
        ),
    )
    router_finish_timeout_s: float = Field(
        1.0, gt=0, le=30, description="With router_sessions: how long a run's end waits for the router, at most."
    )
    program_hints: bool = Field(
        False,
        description=(
            "Root calls carry vllm_xargs.agentic_context (the run as the program, a child RLM's parent and "
            "root) for vllm-router --enable-program-scheduling."
        ),
    )
