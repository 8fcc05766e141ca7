"""The events section: a run's event stream over SSE (`/runs/api/runs/{id}/events`) and the
webhooks that tell a callback a run has ended (docs/events-and-webhooks.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlm_mcp.config.values import SECTION_CONFIG


class EventSettings(BaseModel):
    """RLM_MCP_ settings of run event streams and webhooks (`settings.events`)."""

    model_config = SECTION_CONFIG

    event_streams_max: int = Field(
        64, ge=0, description="Run event streams (SSE) open at once, all owners; more are refused (429)."
    )
    event_streams_per_owner: int = Field(
        8, ge=0, description="Run event streams one owner (token) may hold open at once; more are refused (429)."
    )
    event_stream_idle_s: float = Field(
        300.0, gt=0, description="A run event stream with no new event this long is closed (the client resumes)."
    )
    event_stream_max_s: float = Field(
        3600.0, gt=0, description="The longest one run event stream stays open (the client resumes with Last-Event-ID)."
    )
    event_stream_heartbeat_s: float = Field(
        15.0,
        gt=0,
        description="A comment line is sent this often on a quiet event stream (keeps proxies from closing it).",
    )
    event_stream_poll_s: float = Field(
        0.5, gt=0, description="How often an event stream reads the run's new events from the store."
    )
    webhook_timeout_s: float = Field(10.0, gt=0, description="One webhook delivery's connect-and-answer time limit.")
    webhook_max_attempts: int = Field(
        8,
        ge=1,
        description="Webhook delivery attempts per run end before it is marked failed (backoff doubles from 5 s).",
    )
    webhook_max_payload_bytes: int = Field(
        16384, ge=256, description="The largest webhook body; a larger one is cut to the thin payload (type, run id)."
    )
    webhook_retention_days: float = Field(
        7.0, gt=0, description="Webhook delivery records (delivered or failed) are kept this long."
    )
    webhook_poll_s: float = Field(2.0, gt=0, description="How often the webhook deliverer looks for due deliveries.")
