"""What tests and benchmarks ask of a `SandboxManager` that the service never does: the warm
pool's size, the Docker client of a Docker backend, and the orphan reaping run again."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlm_mcp.sandbox.manager import SandboxManager

__all__ = ["docker_client", "pool_ready", "reap_orphans"]


def pool_ready(mgr: SandboxManager) -> int:
    """Warm, kernel-ready sandboxes the manager's pool holds now."""
    return len(mgr._pool)


async def docker_client(mgr: SandboxManager) -> Any:
    """The connected Docker client of a Docker backend (a docker-py `DockerClient`)."""
    client = getattr(mgr.backend, "client", None)
    if client is None:
        raise RuntimeError(f"the {mgr.backend.name} backend has no Docker client")
    return await client()


async def reap_orphans(mgr: SandboxManager) -> None:
    """Run the orphan reaping again (`ensure_ready` does it once)."""
    await mgr.backend.reap(mgr.liveness, mgr.owner_id)
