"""`DockerBackend`: the `SandboxBackend` on a Docker engine (rlm_mcp.ports.kernel).

Makes hardened containers that run the kernel (`KernelContainer`), checks the image, removes
the stopped sandboxes of dead owners and, at shutdown, every sandbox of this server, reads the
engine's CPU count and updates CPU quotas in place.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

import anyio

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import CpuLimitFixed, SandboxError
from rlm_mcp.ports.kernel import KernelChannel
from rlm_mcp.ports.owners import OwnerLiveness
from rlm_mcp.sandbox.docker.container import KernelContainer
from rlm_mcp.sandbox.docker.docker_api import LazyDocker, connect_sync, docker_errors, require_image_sync
from rlm_mcp.sandbox.docker.engine import (
    EngineInfo,
    check_engine,
    check_limits,
    probe_sync,
    update_failure,
    update_fix,
)
from rlm_mcp.sandbox.docker.fastchan import FastChannels, remove_dead_roots, remove_orphan_dir
from rlm_mcp.sandbox.docker.faults import is_refused, lost_error, update_unsupported
from rlm_mcp.sandbox.docker.hardening import CPU_PERIOD_US, LABEL_OWNER, LABEL_ROLE, ROLE_SANDBOX, cpu_quota

log = logging.getLogger("rlm_mcp.sandbox")


class DockerBackend:
    """Sandboxes as Docker containers, through one lazily made client."""

    name = "docker"

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self._docker = LazyDocker()
        self.engine: EngineInfo | None = None  # what the engine is and can do (engine.py), once checked
        self.channels = FastChannels(settings)  # whether frames may use a unix socket (fastchan.py)

    async def client(self) -> Any:
        """The connected Docker client (made on first use in a worker thread)."""
        return await self._docker.get()

    async def describe(self) -> str:
        client = await self._docker.get()
        version: dict[str, Any] = await anyio.to_thread.run_sync(client.version)
        engine = await self._engine(client)
        self.channels.decide(engine)
        return f"{engine.describe()} (API {version.get('ApiVersion', '?')}); {self.channels.describe()}"

    async def _engine(self, client: Any) -> EngineInfo:
        if self.engine is None:
            with docker_errors():
                self.engine = await anyio.to_thread.run_sync(probe_sync, client, self.settings)
        return self.engine

    async def check_ready(self) -> None:
        client = await self._docker.get()
        check_engine(await self._engine(client), self.settings)  # never run sandboxes without their limits
        await anyio.to_thread.run_sync(require_image_sync, client, self.settings.sandbox_image)

    async def check_limits(self, timeout_s: float) -> None:
        """The engine's limits, read on a connection of its own with a short timeout (`serve`
        checks them at start; a slow engine must not hold the start for the client's 30 s)."""
        with anyio.fail_after(timeout_s):
            await anyio.to_thread.run_sync(limits_sync, self.settings, timeout_s, abandon_on_cancel=True)

    async def start(self, owner_id: str) -> KernelChannel:
        client = await self._docker.get()
        self.channels.decide(self.engine)  # known once check_ready ran (the manager's first start)
        return await KernelContainer.start(client, self.settings, owner_id, self.engine, self.channels)

    async def capacity_cpus(self) -> float | None:
        client = await self._docker.get()
        return await anyio.to_thread.run_sync(docker_host_cpus, client)

    async def set_cpus(self, channel: KernelChannel, cpus: float) -> None:
        assert isinstance(channel, KernelContainer)
        if channel.id is None:
            return
        container_id, quota = channel.id, cpu_quota(cpus)
        try:
            await anyio.to_thread.run_sync(
                lambda: channel.calls.update_container(container_id, cpu_period=CPU_PERIOD_US, cpu_quota=quota)
            )
        except Exception as exc:
            if update_unsupported(exc):  # Debian's runsc, Podman: the CPU shares fall back (cpu.py)
                raise CpuLimitFixed(update_failure(exc, self.engine), update_fix(self.engine)) from exc
            raise

    async def reap(self, liveness: OwnerLiveness, owner_id: str) -> None:
        client = await self._docker.get()
        await anyio.to_thread.run_sync(reap_sync, client, liveness, owner_id)

    async def remove_owned(self, owner_id: str) -> None:
        if self._docker._client is None:
            return
        client = self._docker.client

        def remove() -> None:
            try:
                found = client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner_id}"})
            except Exception:
                return
            for info in found:
                try:
                    client.api.remove_container(info["Id"], force=True)
                except Exception:
                    pass

        with anyio.move_on_after(30):
            await anyio.to_thread.run_sync(remove)

    def lost_error(self, attempts: int, detail: str) -> SandboxError:
        return lost_error(attempts, detail)

    def close(self) -> None:
        self._docker.close()
        self.channels.close()


def limits_sync(settings: SandboxSettings, timeout_s: float) -> None:
    """Connect, read the engine and refuse one that cannot enforce the limits (blocking)."""
    client = connect_sync(timeout=max(1.0, timeout_s))
    try:
        with docker_errors():
            check_limits(probe_sync(client, settings))
    finally:
        client.close()


def docker_host_cpus(client: Any) -> float | None:
    """The Docker host's CPU count (blocking: call in a worker thread)."""
    try:
        count = client.info().get("NCPU")
    except Exception as exc:
        log.debug("could not read the Docker host's CPU count: %s", exc)
        return None
    return float(count) if isinstance(count, int) and count > 0 else None


def reap_sync(client: Any, liveness: OwnerLiveness, owner_id: str) -> None:
    """Remove stopped sandboxes whose owner is gone (`liveness`): a dead server's leftovers,
    never a live neighbour's (it may still be reading its exit reason), and the socket
    directories of this host's servers that are gone. Blocking."""
    remove_dead_roots(liveness)
    with docker_errors():
        try:
            found = client.api.containers(all=True, filters={"label": f"{LABEL_ROLE}={ROLE_SANDBOX}"})
        except Exception as exc:
            if not is_refused(exc):
                raise
            log.warning("could not list old sandboxes: %s", exc)
            return
    now = time.time()
    for info in found:
        state = info.get("State")
        if state in ("running", "paused", "restarting", "removing"):
            continue  # possibly another live server's: never touched
        labels = info.get("Labels") or {}
        if labels.get(LABEL_OWNER) == owner_id:
            continue  # ours: released by this server
        if not liveness.owner_gone(labels, idle_s=_idle_s(client, info, now)):
            continue
        try:
            client.api.remove_container(info["Id"], force=True)
            log.info("removed orphaned sandbox %s", info["Id"][:12])
            remove_orphan_dir(labels)
        except Exception as exc:
            log.debug("could not remove orphan %s: %s", info["Id"][:12], exc)


def _idle_s(client: Any, info: dict[str, Any], now: float) -> float:
    """Seconds since the container stopped (since it was created, when it never ran)."""
    created = float(info.get("Created") or now)
    if info.get("State") == "created":
        return now - created
    try:
        finished = client.api.inspect_container(info["Id"])["State"]["FinishedAt"]
        at = datetime.datetime.fromisoformat(finished[:19]).replace(tzinfo=datetime.UTC).timestamp()
    except Exception:
        return now - created
    return now - at if at > created else now - created
