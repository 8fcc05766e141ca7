"""The team section and the deployment it decides: embedded (SQLite and files, one process) or
team mode (shared state on PostgreSQL), and this process's role in a team."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from rlm_mcp.config.values import SECTION_CONFIG
from rlm_mcp.database_url import check_database_url
from rlm_mcp.errors import RlmMcpError

# What one team-mode process does: front (MCP, enqueues runs), worker (executes them) or both.
Role = Literal["both", "front", "worker"]


@dataclass(frozen=True)
class TeamDatabase:
    """Team mode's shared PostgreSQL database: it exists exactly when RLM_MCP_DATABASE_URL is set,
    so a part that takes one cannot be built for the embedded deployment (nothing below re-checks)."""

    dsn: str = field(repr=False)  # a secret: it may carry a password, never log it


@dataclass(frozen=True)
class Deployment:
    """How this process is deployed, decided once from the settings (`settings.deployment`).

    Every part whose behaviour differs between the embedded default and team mode asks this value;
    nothing else tests RLM_MCP_DATABASE_URL. `role` is the configured one: outside team mode any
    role but `both` is refused where a server starts (`served`), and only there: `doctor` and the
    read-only commands work whatever RLM_MCP_ROLE says."""

    role: Role
    database: TeamDatabase | None = None

    @property
    def team(self) -> bool:
        """Shared state on PostgreSQL (`database`)."""
        return self.database is not None

    @property
    def embedded(self) -> bool:
        """One process, its state in SQLite and files under the data dir."""
        return not self.team

    def served(self) -> Deployment:
        """This deployment, for a process that serves or executes runs: a front or a worker
        without the team's database is refused here (the one place "team needs a database" is
        decided)."""
        if self.embedded and self.role != "both":
            raise RlmMcpError(
                f"--role {self.role} needs team mode: fronts and workers share runs through PostgreSQL.",
                "Set RLM_MCP_DATABASE_URL=postgresql://user:password@host:port/db on every replica "
                "(docs/team.md), or serve with --role both (the default).",
            )
        return self

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
    queue_idle_poll_s: float = Field(
        5.0,
        gt=0,
        description="Team mode: how often an idle worker looks at an empty queue while its NOTIFY listener is connected "
        "(every queued run notifies; RLM_MCP_QUEUE_POLL_S while the listener is down or runs it cannot take are queued).",
    )
    queue_local_first: bool = Field(
        True,
        description="Team mode, role both: a run this replica starts goes to its own worker when that worker has "
        "room (a free run slot and sandbox slot), still through the queue (claimed, fenced, recovered as any run), "
        "and the replica follows it in-process; other workers may take it after RLM_MCP_QUEUE_POLL_S if this one "
        "did not. false: every run is offered to all workers (they spread runs among themselves).",
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
        database = None if self.database_url is None else TeamDatabase(self.database_url.get_secret_value())
        return Deployment(role=self.role, database=database)
