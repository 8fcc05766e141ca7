"""The one place a sandbox backend is chosen (RLM_MCP_SANDBOX_BACKEND; docs/architecture.md),
and what `serve` checks of it at start.

The generic sandbox code never imports a backend's package; this module maps the setting to one.
"""

from __future__ import annotations

import logging

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import SandboxError
from rlm_mcp.ports.kernel import SandboxBackend

log = logging.getLogger("rlm_mcp.sandbox")

# How long `serve` waits at start for the engine to say what it can enforce.
START_CHECK_S = 10.0


def backend_for(settings: SandboxSettings) -> SandboxBackend:
    """The configured backend (Docker is the only one so far)."""
    if settings.sandbox_backend == "docker":
        from rlm_mcp.sandbox.docker.backend import DockerBackend

        return DockerBackend(settings)
    raise ValueError(f"unknown sandbox backend {settings.sandbox_backend!r}")  # config/sandbox.py validates it


async def refuse_unlimited_sandboxes(settings: SandboxSettings, timeout_s: float = START_CHECK_S) -> None:
    """At `serve` start, in a process that runs sandboxes: an engine that answers and cannot
    enforce the sandbox's limits (rootless Podman or Docker on cgroup v1) stops the start with
    the reason and the fix (`SandboxError`). An engine that cannot be reached, or not in time,
    does not: the server starts as before and the first run says why it cannot start sandboxes."""
    backend = backend_for(settings)
    try:
        await backend.check_limits(timeout_s)
    except SandboxError:
        raise
    except Exception as exc:  # unreachable, slow, or an odd answer: left to the first run
        log.info("sandbox engine not checked at start (%s); the first run checks it", exc or type(exc).__name__)
    finally:
        backend.close()
