"""The one place a sandbox backend is chosen (RLM_MCP_SANDBOX_BACKEND; docs/architecture.md).

The generic sandbox code never imports a backend's package; this module maps the setting to one.
"""

from __future__ import annotations

from rlm_mcp.config import Settings
from rlm_mcp.ports.kernel import SandboxBackend


def backend_for(settings: Settings) -> SandboxBackend:
    """The configured backend (Docker is the only one so far)."""
    if settings.sandbox_backend == "docker":
        from rlm_mcp.sandbox.docker.backend import DockerBackend

        return DockerBackend(settings)
    raise ValueError(f"unknown sandbox backend {settings.sandbox_backend!r}")  # config.py validates it
