"""The team section and the deployment it decides: embedded (SQLite and files, one process) or
team mode (shared state on PostgreSQL), and this process's role in a team."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from rlm_mcp.config.values import SECTION_CONFIG
from rlm_mcp.database_url import check_database_url
from rlm_mcp.errors import RlmMcpError

# What one team-mode process does: front (MCP, enqueues runs), worker (executes them) or both.
Role = Literal["both", "front", "worker"]


@dataclass(frozen=True)
class Deployment:
    """How this process is deployed, decided once from the settings (`settings.deployment`).

    Every part whose behaviour differs between the embedded default and team mode asks this value;
    nothing else tests RLM_MCP_DATABASE_URL. `role` is the configured one: outside team mode any
    role but `both` is refused where a server starts (cli/serve.py)."""

    team: bool
    role: Role

    @property
    def embedded(self) -> bool:
        """One process, its state in SQLite and files under the data dir."""
        return not self.team

    @property
    def executes_runs(self) -> bool:
        """This process runs sandboxes and RLM runs (a front only enqueues them)."""
        return self.role != "front"

    @property
    def serves_mcp(self) -> bool:
        """This process answers MCP clients (a worker serves only health and metrics)."""
        return self.role != "worker"

    @property
    def name(self) -> str:
        """`embedded`, or the team role (`both`, `front`, `worker`): for logs and health."""
        return self.role if self.team else "embedded"


class TeamSettings(BaseModel):
    """RLM_MCP_ settings of team mode (docs/team.md) (`settings.team`)."""

    model_config = SECTION_CONFIG

    database_url: SecretStr | None = Field(
        None,
        description="postgresql://user:password@host:port/db: shared state on PostgreSQL (needs the team extra: `uv run --extra team` from a checkout).",
    )
    role: Role = Field(
        "both",
        description="Team mode: front (MCP, enqueues runs), worker (runs queued runs, no MCP) or both.",
    )
    worker_lease_s: float = Field(
        30.0, gt=0, description="Team mode: a worker silent this long is lost; its runs end with a status."
    )
    queue_poll_s: float = Field(
        1.0, gt=0, description="Team mode: how often fronts and workers poll the queue (NOTIFY wakes them sooner)."
    )

    @field_validator("database_url", mode="after")
    @classmethod
    def _check_database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None  # an empty variable: the embedded store
        check_database_url(value.get_secret_value())  # never echoes the value: it may carry a password
        return value

    @property
    def deployment(self) -> Deployment:
        """The one place that decides the mode: team mode exactly when a database URL is set."""
        return Deployment(team=self.database_url is not None, role=self.role)

    def database_dsn(self) -> str:
        """The PostgreSQL connection string of team mode (a secret: never log it)."""
        if self.database_url is None:
            raise RlmMcpError("Team mode needs a database.", "Set RLM_MCP_DATABASE_URL=postgresql://...")
        return self.database_url.get_secret_value()
