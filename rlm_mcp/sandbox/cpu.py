"""`CpuShares`: the sandboxes of one server together never get more CPU than the machine has.

Each sandbox is created with `RLM_MCP_SANDBOX_CPUS`; while N sandboxes are in use by runs, each
gets min(that, total / N), where total is `RLM_MCP_SANDBOX_TOTAL_CPUS` (default: the backend's
CPU count, e.g. the Docker host's). Limits are updated in place (`SandboxBackend.set_cpus`, on
Docker `docker update`), so a lone run keeps its full
quota and eight busy ones share the cores instead of slowing each other's cells 3x. Warm pool
containers run no user code and are not counted. Chosen over a cgroup parent, which needs a
pre-made cgroup (root, systemd slices) and does not exist on Docker Desktop or remote engines.

Where the backend cannot change a limit in place (Debian's 2022 gVisor `runsc`, Podman's
compatible API: see sandbox/docker/engine.py), its `set_cpus` raises `CpuLimitFixed`, at the
first update or at `probe` on the first sandbox: the shares switch off for good, every sandbox
keeps the fixed limit it was created with, and the log and `rlm-mcp doctor` say so (`fallback`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from rlm_mcp.errors import CpuLimitFixed
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
        self.max_sandboxes = 1  # for the fallback's message (the manager sets it)
        self.fixed: CpuLimitFixed | None = None  # why limits cannot change here (then each keeps its own)
        self.probed = False
        self._probe_lock = anyio.Lock()  # sandboxes started meanwhile wait for the one probe's answer

    def fallback(self, max_sandboxes: int) -> tuple[str, str] | None:
        """(what happens, the fix) while limits cannot be changed here; None while sharing works."""
        if self.fixed is None:
            return None
        what = (
            f"CPU sharing is off: {self.fixed.cause}. Each sandbox keeps a fixed quota of {self.per_sandbox:g} CPUs, "
            f"so {max_sandboxes} sandboxes may use up to {self.per_sandbox * max_sandboxes:g} CPUs together"
        )
        fix = self.fixed.fix or "Use a backend that changes CPU limits in place"
        if self.total is not None:
            what += f" (the host has {self.total:g})"
            fix += f", or cap the total with RLM_MCP_SANDBOX_CPUS={max(self.total / max_sandboxes, 0.01):.2f}"
        return what + ".", fix + "."

    def _switch_off(self, exc: CpuLimitFixed, max_sandboxes: int) -> None:
        if self.fixed is None:
            self.fixed = exc
            what, fix = self.fallback(max_sandboxes) or ("", "")
            log.warning("%s Fix: %s", what, fix)

    async def probe(self, container: KernelChannel, max_sandboxes: int) -> None:
        """Once, on a fresh sandbox: set its limit to what it already has, to learn whether the
        backend can change limits in place before any sharing depends on it. Sandboxes started
        while it is asked wait for the answer, so none is handed out before it is known."""
        if self.probed:
            return
        async with self._probe_lock:
            if self.probed:
                return
            try:
                await self._set_cpus(container, self.per_sandbox)
            except CpuLimitFixed as exc:
                self._switch_off(exc, max_sandboxes)
            except Exception as exc:  # the sandbox went away or the connection failed: ask again later
                log.debug("could not probe the CPU limit of %s: %s", container.name, exc)
                return
            self.probed = True

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
        if self.fixed is not None:
            return
        cpus = self.share(len(self._in_use))
        quota = cpu_steps(cpus)
        changed = [c for c, q in self._in_use.items() if q != quota]
        if not changed:
            return

        async def update(container: KernelChannel) -> None:
            try:
                await self._set_cpus(container, cpus)
            except CpuLimitFixed as exc:
                self._switch_off(exc, self.max_sandboxes)
                return
            except Exception as exc:
                log.debug("could not set the CPU limit of %s: %s", container.name, exc)
                return
            if container in self._in_use:
                self._in_use[container] = quota

        with anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:
                for container in changed:
                    tg.start_soon(update, container)
