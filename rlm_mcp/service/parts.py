"""The parts an `RlmService` runs on. The service builds none of them: the assembly
(rlm_mcp/assembly/) builds them for this process's role and passes them in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlm_mcp.engine import RLMEngine
from rlm_mcp.lm.client import LMClient
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.backends import RunBackend
from rlm_mcp.service.contexts import ContextLoader
from rlm_mcp.service.sessions import SessionManager
from rlm_mcp.store.bundle import Stores

if TYPE_CHECKING:
    from rlm_mcp.service.team_sessions import TeamSessions  # team mode only: it needs the team extra

# Opens where runs execute on the service's exit stack (closed with it), once the stores and the
# sandboxes are open; the engine is built at the first run that needs one.
RunsOpener = Callable[[AsyncExitStack, Callable[[], Awaitable[RLMEngine]]], Awaitable[RunBackend]]


@dataclass
class ServiceParts:
    """What one `RlmService` owns and closes: entered in this order, closed in reverse."""

    stores: Stores  # entered first, closed last: runs record into them
    lm: LMClient
    sandboxes: SandboxManager
    loader: ContextLoader
    sessions: SessionManager  # closed before the runs: a session's REPL goes back to its sandboxes
    open_runs: RunsOpener
    team_sessions: TeamSessions | None = None  # team mode: kept sessions in the database
