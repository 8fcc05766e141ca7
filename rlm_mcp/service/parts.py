"""The parts an `RlmService` runs on. The service builds none of them: the assembly
(rlm_mcp/assembly/) builds them for this process's role and passes them in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

from rlm_mcp.config import EngineSettings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.lm.client import LMClient
from rlm_mcp.ports.sessions import SessionBackend
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.backends import RunBackend
from rlm_mcp.service.contexts import ContextLoader
from rlm_mcp.service.webhooks import Webhooks
from rlm_mcp.store.bundle import Stores

# Kept sessions as the service sees them, in either mode (ports/sessions.py).
Sessions = SessionBackend[ActiveRun, RLMEngine]
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
    sessions: Sessions  # closed before the runs: a session's REPL goes back to its sandboxes
    open_runs: RunsOpener
    webhooks: Webhooks  # its deliverer runs while the service does (stopped after the runs end)
    engine: EngineSettings  # what the engine, built at the first run, reads
