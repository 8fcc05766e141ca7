"""`CpuShares`: the sandboxes of one server together never get more CPU than the machine has.

Each sandbox is created with `RLM_MCP_SANDBOX_CPUS`; while N sandboxes are in use by runs, each
gets min(that, total / N), where total is `RLM_MCP_SANDBOX_TOTAL_CPUS` (default: the backend's
CPU count, e.g. the Docker host's). Limits are updated in place (`SandboxBackend.set_cpus`, on
Docker `docker update`), so a lone run keeps its full
quota and eight busy ones share the cores instead of slowing each other's cells 3x. Warm pool
containers run no user code and are not counted. Chosen over a cgroup parent, which needs a
pre-made cgroup (root, systemd slices) and does not exist on Docker Desktop or remote engines.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from rlm_mcp.ports.kernel import KernelChannel

log = logging.getLogger("rlm_mcp.sandbox")

SETTLE_S = 0.2  # changes within this long after the first share one pass of updates
CPU_STEP = 0.01  # Docker's smallest CPU quota (1 ms per 100 ms period): limits are kept in these steps


def cpu_steps(cpus: float) -> int:
    """A CPU limit in the backend's steps (what counts as a change)."""
    return max(round(cpus / CPU_STEP), 1)


class CpuShares:
    """Splits a total CPU quota between the containers in use.

    Membership changes are instant; the quotas follow in a background pass (`run`), which waits
    `SETTLE_S` so that a burst of runs starting or ending together costs one `docker update` per
    container instead of one per container per change (N runs starting at once used to make
    N^2/2 calls, each ~1 ms of this process's CPU, all on the runs' start path). Until the pass
    lands, the aggregate may exceed the total by the newcomers' quotas for a fraction of a second.
    """

    def __init__(self, per_sandbox: float, set_cpus: Callable[[KernelChannel, float], Awaitable[None]]) -> None:
        self.per_sandbox = per_sandbox
        self.total: float | None = None  # None: no cap (set once the backend's capacity is known)
        self._set_cpus = set_cpus
        self._in_use: dict[KernelChannel, int] = {}  # sandbox -> limit it has now, in CPU_STEPs
        self._changed = anyio.Event()
        self._background = False  # a `run` task is applying the quotas

    def share(self, count: int) -> float:
        if self.total is None or count == 0:
            return self.per_sandbox
        return min(self.per_sandbox, self.total / count)

    async def add(self, container: KernelChannel) -> None:
        self._in_use[container] = cpu_steps(self.per_sandbox)  # its limit at creation
        await self._changes()

    async def remove(self, container: KernelChannel) -> None:
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
        cpus = self.share(len(self._in_use))
        quota = cpu_steps(cpus)
        changed = [c for c, q in self._in_use.items() if q != quota]
        if not changed:
            return

        async def update(container: KernelChannel) -> None:
            try:
                await self._set_cpus(container, cpus)
            except Exception as exc:
                log.debug("could not set the CPU limit of %s: %s", container.name, exc)
                return
            if container in self._in_use:
                self._in_use[container] = quota

        with anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:
                for container in changed:
                    tg.start_soon(update, container)
