"""The composition root: builds the parts each role runs on and passes them in.

A process is one of three roles, decided once from the settings (`settings.deployment`):

- **embedded** (no RLM_MCP_DATABASE_URL): SQLite and files, runs execute here;
- **front** (team mode, `--role front`): the shared PostgreSQL store, runs go to the queue;
- **worker** (team mode, `--role worker`): the shared store, claims queued runs and executes
  them; `--role both` is a front and a worker in one process.

`roles.py` has one builder per role, each returning the `ServiceParts` (stores, LM client,
sandbox manager, context loader, kept sessions, run backend) that `RlmService` receives; every
component takes its own settings section. Nothing below this package builds a part itself.
"""

from rlm_mcp.assembly.roles import (
    build_service,
    embedded,
    front,
    make_stores,
    run_ends,
    service_parts,
    team_sessions,
    worker,
)

__all__ = ["build_service", "embedded", "front", "make_stores", "run_ends", "service_parts", "team_sessions", "worker"]
