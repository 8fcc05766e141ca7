"""`CpuShares`: the sandboxes of one server together never get more CPU than the machine has.

Each sandbox is created with `RLM_MCP_SANDBOX_CPUS`; while N sandboxes are in use by runs, each
gets min(that, total / N), where total is `RLM_MCP_SANDBOX_TOTAL_CPUS` (default: the Docker
host's CPU count). Quotas are updated in place (`docker update`), so a lone run keeps its full
quota and eight busy ones share the cores instead of slowing each other's cells 3x. Warm pool
containers run no user code and are not counted. Chosen over a cgroup parent, which needs a
pre-made cgroup (root, systemd slices) and does not exist on Docker Desktop or remote engines.

Where the engine cannot update a quota in place (Debian's 2022 gVisor `runsc`, Podman's
compatible API: see engine.py), the first failed update, or `probe` on the first sandbox,
switches the shares off for good: every sandbox keeps the fixed quota it was created with,
`fixed` says why, and `rlm-mcp doctor` and the log say so. Never silently.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from rlm_mcp.sandbox.container import KernelContainer
from rlm_mcp.sandbox.engine import update_failure, update_unsupported
from rlm_mcp.sandbox.hardening import CPU_PERIOD_US, cpu_quota

log = logging.getLogger("rlm_mcp.sandbox")

SETTLE_S = 0.2  # changes within this long after the first share one pass of updates


def docker_host_cpus(client: Any) -> float | None:
    """The Docker host's CPU count (blocking: call in a worker thread)."""
    try:
        count = client.info().get("NCPU")
    except Exception as exc:
        log.debug("could not read the Docker host's CPU count: %s", exc)
        return None
    return float(count) if isinstance(count, int) and count > 0 else None


class CpuShares:
    """Splits a total CPU quota between the containers in use.

    Membership changes are instant; the quotas follow in a background pass (`run`), which waits
    `SETTLE_S` so that a burst of runs starting or ending together costs one `docker update` per
    container instead of one per container per change (N runs starting at once used to make
    N^2/2 calls, each ~1 ms of this process's CPU, all on the runs' start path). Until the pass
    lands, the aggregate may exceed the total by the newcomers' quotas for a fraction of a second.
    """

    def __init__(self, per_sandbox: float) -> None:
        self.per_sandbox = per_sandbox
        self.total: float | None = None  # None: no cap (set once the Docker host is known)
        self._in_use: dict[KernelContainer, int] = {}  # container -> quota it has now
        self._changed = anyio.Event()
        self._background = False  # a `run` task is applying the quotas
        self.fixed: str | None = None  # why quotas cannot be updated here (then each keeps its own)
        self.probed = False

    def fallback(self, max_sandboxes: int, podman: bool = False) -> tuple[str, str] | None:
        """(what happens, the fix) while quotas cannot be updated here; None while sharing works."""
        if self.fixed is None:
            return None
        what = (
            f"CPU sharing is off: {self.fixed}. Each sandbox keeps a fixed quota of {self.per_sandbox:g} CPUs, "
            f"so {max_sandboxes} sandboxes may use up to {self.per_sandbox * max_sandboxes:g} CPUs together"
        )
        fix = (
            "Use Docker, whose API updates quotas in place (Podman's compatible API cannot)"
            if podman
            else "Use a runtime that updates quotas in place (runc, or a current gVisor release)"
        )
        if self.total is not None:
            what += f" (the host has {self.total:g})"
            fix += f", or cap the total with RLM_MCP_SANDBOX_CPUS={max(self.total / max_sandboxes, 0.01):.2f}"
        return what + ".", fix + "."

    def _switch_off(self, exc: BaseException, container: KernelContainer) -> None:
        if self.fixed is None:
            self.fixed = update_failure(exc, container.engine)
            podman = container.engine is not None and container.engine.podman
            what, fix = self.fallback(container.settings.max_sandboxes, podman) or ("", "")
            log.warning("%s Fix: %s", what, fix)

    async def probe(self, container: KernelContainer) -> None:
        """Once, on a fresh sandbox: set its quota to what it already has, to learn whether the
        engine can update quotas in place before any sharing depends on it."""
        if self.probed or not container.id:
            return
        self.probed = True

        def call() -> None:
            quota = cpu_quota(self.per_sandbox)
            container.client.api.update_container(container.id, cpu_period=CPU_PERIOD_US, cpu_quota=quota)

        try:
            await anyio.to_thread.run_sync(call)
        except Exception as exc:
            if update_unsupported(exc):
                self._switch_off(exc, container)
            else:
                self.probed = False  # the container went away or the connection failed: ask again later

    def share(self, count: int) -> float:
        if self.total is None or count == 0:
            return self.per_sandbox
        return min(self.per_sandbox, self.total / count)

    async def add(self, container: KernelContainer) -> None:
        self._in_use[container] = cpu_quota(self.per_sandbox)  # its quota at creation
        await self._changes()

    async def remove(self, container: KernelContainer) -> None:
        if self._in_use.pop(container, None) is not None:
            await self._changes()

    async def _changes(self) -> None:
        if self._background:
            self._changed.set()
        else:  # no background task (a manager used without its task group): apply now
            await self.apply()

    async def run(self) -> None:
        """Apply the quotas after every burst of changes, until cancelled."""
        self._background = True
        try:
            while True:
                await self._changed.wait()
                await anyio.sleep(SETTLE_S)
                self._changed = anyio.Event()
                await self.apply()
        finally:
            self._background = False

    async def apply(self) -> None:
        """Bring every container in use to its share now (containers that left are skipped)."""
        if self.fixed is not None:
            return
        quota = cpu_quota(self.share(len(self._in_use)))
        changed = [c for c, q in self._in_use.items() if q != quota and c.id]
        if not changed:
            return

        async def update(container: KernelContainer) -> None:
            def call() -> None:
                container.client.api.update_container(container.id, cpu_period=CPU_PERIOD_US, cpu_quota=quota)

            try:
                await anyio.to_thread.run_sync(call)
            except Exception as exc:
                if update_unsupported(exc):
                    self._switch_off(exc, container)
                else:
                    log.debug("could not set the CPU quota of %s: %s", container.name, exc)
                return
            if container in self._in_use:
                self._in_use[container] = quota

        with anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:
                for container in changed:
                    tg.start_soon(update, container)
