"""The live-summary section: how often a team worker publishes a running run's live state."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlm_mcp.config.values import SECTION_CONFIG


class PublishSettings(BaseModel):
    """RLM_MCP_ settings of a worker's live-summary writes (`settings.publish`)."""

    model_config = SECTION_CONFIG

    live_summary_interval_s: float = Field(
        0.1,
        ge=0,
        description="Team mode: a worker writes a running run's live summary (with its staged events and the "
        "wake-up) once per this interval, the latest state after a burst of progress, at the process's ticks of "
        "this period (a worker's runs then publish together, in one statement; a summary follows the last one "
        "by at least half an interval); 0: on every progress event. "
        "The first answered LM call and the final record are written at once, never coalesced. "
        "This interval applies to a run someone follows (a caller with a progress token, an event stream, "
        "the viewer's live page); see RLM_MCP_LIVE_SUMMARY_UNFOLLOWED_INTERVAL_S for the others.",
    )
    live_summary_unfollowed_interval_s: float = Field(
        1.0,
        ge=0,
        description="Team mode: the live-summary interval of a run nobody follows (no front has said it follows "
        "its progress), its first one too at this interval's tick (a run that ends sooner publishes none: its final "
        "record carries everything); its staged events are still written at least every RLM_MCP_QUEUE_POLL_S. "
        "Only its first one wakes the fronts; the later ones are written to the run's row, which a front reads when "
        "asked about the run. A follow is a hint for latency only: a follow that arrives mid-run switches the run to "
        "RLM_MCP_LIVE_SUMMARY_INTERVAL_S.",
    )
