"""`SandboxManager`: the sandbox layer as the service uses it.

It owns the Docker client, the warm pool and every container it started (labelled with its
owner id), and removes them all on exit. Several servers share one daemon: at start it reaps
only labelled containers that are no longer running, never another server's live ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any

import anyio

from rlm_mcp.config import Settings, parse_size
from rlm_mcp.engine.ports import ContextSpec
from rlm_mcp.errors import contexts_over_sandbox_memory
from rlm_mcp.sandbox.container import KernelContainer
from rlm_mcp.sandbox.cpu import CpuShares, docker_host_cpus
from rlm_mcp.sandbox.docker_api import LazyDocker, docker_errors, require_image_sync
from rlm_mcp.sandbox.engine import EngineInfo, check_engine, probe_sync
from rlm_mcp.sandbox.hardening import LABEL_OWNER, LABEL_ROLE, ROLE_SANDBOX
from rlm_mcp.sandbox.pool import WarmPool
from rlm_mcp.sandbox.quiet import QuietGate
from rlm_mcp.sandbox.recovery import LostCount, start_loaded
from rlm_mcp.sandbox.session import DockerSandbox
from rlm_mcp.sandbox.slots import SandboxSlots

log = logging.getLogger("rlm_mcp.sandbox")

CREATED_GRACE_S = 120.0  # a 'created' container younger than this may be starting
KERNEL_BASE_BYTES = 48 << 20  # the interpreter, kernel threads and frame buffers
BACKGROUND_REMOVALS = 8  # used containers being removed after their run returned, at most


def estimate_context_memory(spec: ContextSpec) -> int:
    """Peak bytes a context needs inside the sandbox while it loads (chunks + joined value)."""
    if spec.format == "json":
        # The text, then the parsed objects: Python objects take several times the JSON size.
        return spec.bytes * 2 + spec.bytes * 6
    width = 1 if spec.bytes <= spec.chars else 4  # ASCII: 1 byte per char; otherwise up to 4
    return 2 * spec.chars * width


class SandboxManager:
    """Opens sandboxes for runs (a `SandboxFactory`), with a warm pool and owned cleanup.

    Enter and leave it in one task (it holds the pool's task group), e.g. in the server lifespan.
    """

    def __init__(self, settings: Settings, *, owner_id: str | None = None) -> None:
        self.settings = settings
        self.owner_id = owner_id or settings.instance_id or secrets.token_hex(8)
        self._docker = LazyDocker()
        self._ready = False
        self._ready_lock = anyio.Lock()
        # Not a CapacityLimiter (one task may hold several); grants keep room for descendants.
        self._slots = SandboxSlots(settings.max_sandboxes)
        self._live: set[KernelContainer] = set()
        self._retired: set[KernelContainer] = set()  # closed after use, removal pending
        self._cpu = CpuShares(settings.sandbox_cpus)
        self.engine: EngineInfo | None = None  # what the engine is and can do (engine.py), once connected
        # As many as can end together: a burst of runs ending at once must not wait for Docker
        # (a removal under load takes ~0.3 s) before returning their results.
        self._removals = anyio.Semaphore(max(BACKGROUND_REMOVALS, settings.max_sandboxes))
        # Pool refills and background removals wait until no run is using a sandbox (quiet.py).
        self._quiet = QuietGate()
        self._pool = WarmPool(settings.pool_size, self._start_container, self._discard, quiet=self._quiet.wait_quiet)
        self._tg: anyio.abc.TaskGroup | None = None
        self._exit_stack: contextlib.AsyncExitStack | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> SandboxManager:
        stack = contextlib.AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._exit_stack = stack
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            # The task group must be left in the scope it was entered in (not inside a shield).
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
            if self._exit_stack is not None:
                await self._exit_stack.aclose()
        finally:
            self._tg = None
            self._exit_stack = None
            with anyio.CancelScope(shield=True):
                await self._pool.drain()
                for container in list(self._live):
                    await self._discard(container)
                await self._remove_leftovers()
                self._docker.close()

    async def ensure_ready(self) -> None:
        """Connect to Docker, check the image, reap orphans once, start the pool refill."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            client = await self._docker.get()
            with docker_errors():
                engine = await anyio.to_thread.run_sync(probe_sync, client, self.settings)
            check_engine(engine, self.settings)  # never run sandboxes without their limits
            self.engine = engine
            await anyio.to_thread.run_sync(require_image_sync, client, self.settings.sandbox_image)
            await anyio.to_thread.run_sync(self._reap_orphans_sync, client)
            total = self.settings.sandbox_total_cpus
            if total is None:
                total = await anyio.to_thread.run_sync(docker_host_cpus, client) or float(os.cpu_count() or 1)
            self._cpu.total = total
            if self._tg is not None:
                self._tg.start_soon(self._cpu.run)
                if self.settings.pool_size > 0:
                    self._tg.start_soon(self._pool.refill_forever)
            self._ready = True

    def check_fits(self, contexts: Sequence[ContextSpec]) -> None:
        limit = parse_size(self.settings.sandbox_memory)
        need = sum(estimate_context_memory(spec) for spec in contexts)
        usable = int(limit * 0.85) - KERNEL_BASE_BYTES
        if need > usable:
            raise contexts_over_sandbox_memory(need, usable, self.settings.sandbox_memory)

    def open(
        self, contexts: Sequence[ContextSpec], *, levels_below: int = 0
    ) -> AbstractAsyncContextManager[DockerSandbox]:
        """A sandbox with `contexts` loaded; `levels_below`: how many levels of child runs (each with
        a sandbox) the run using it may still start, so that the slot cap cannot deadlock."""
        return self._open(list(contexts), levels_below)

    @contextlib.asynccontextmanager
    async def _open(self, contexts: list[ContextSpec], levels_below: int) -> AsyncIterator[DockerSandbox]:
        await self.ensure_ready()
        self.check_fits(contexts)
        async with self._slots.hold(levels_below), self._quiet.in_use():
            sandbox: DockerSandbox | None = None
            container = await start_loaded(self._acquire, self._discard, contexts, self.settings, LostCount())
            try:
                sandbox = DockerSandbox(self.settings, contexts, container, self._acquire, self._retire)
                yield sandbox
            finally:
                with anyio.CancelScope(shield=True):
                    if sandbox is not None:
                        await sandbox.close()  # retires the container it holds (this one or a replacement)
                    else:
                        await self._retire(container)

    # -- containers ------------------------------------------------------------------------
    async def _acquire(self) -> KernelContainer:
        """A container for a run: from the pool, else a new one; counted in the CPU shares."""
        container = self._pool.take()
        if container is None:
            container = await self._start_container()
        try:
            await self._cpu.add(container)
        except BaseException:
            await self._discard(container)
            raise
        return container

    async def _start_container(self) -> KernelContainer:
        client = await self._docker.get()
        container = await KernelContainer.start(client, self.settings, self.owner_id, self.engine)
        self._live.add(container)
        if not self._cpu.probed:
            await self._cpu.probe(container)
        return container

    async def _discard(self, container: KernelContainer) -> None:
        with anyio.CancelScope(shield=True):
            await container.kill()
            await self._cpu.remove(container)  # the others' shares grow back
            self._live.discard(container)
            self._retired.discard(container)

    async def _retire(self, container: KernelContainer) -> None:
        """Close a used container now and remove it from Docker in the background.

        The removal is a ~0.2 s Docker round trip the caller (a finishing run) need not wait for.
        At most `_removals` run in the background; past that the caller removes it itself, so a
        burst of runs cannot pile up dead containers. Shutdown removes whatever is still pending.
        """
        if container in self._retired:
            return  # retired once already: a second removal would take a second slot
        self._retired.add(container)
        container.close()
        with anyio.CancelScope(shield=True):
            await self._cpu.remove(container)  # the run is done with it: the others' shares grow back now
        if self._tg is None or not self._try_removal_slot():
            await self._discard(container)
            return
        self._tg.start_soon(self._remove_in_background, container)

    def _try_removal_slot(self) -> bool:
        try:
            self._removals.acquire_nowait()
        except anyio.WouldBlock:
            return False
        return True

    async def _remove_in_background(self, container: KernelContainer) -> None:
        try:
            await self._quiet.wait_quiet()
            await self._discard(container)
        finally:
            self._removals.release()

    def _reap_orphans_sync(self, client: Any) -> None:
        """Remove labelled sandboxes that no longer run (any owner): a dead server's leftovers."""
        import docker.errors

        with docker_errors():
            try:
                found = client.api.containers(all=True, filters={"label": f"{LABEL_ROLE}={ROLE_SANDBOX}"})
            except docker.errors.APIError as exc:
                log.warning("could not list old sandboxes: %s", exc)
                return
        now = time.time()
        for info in found:
            state = info.get("State")
            if state in ("running", "paused", "restarting", "removing"):
                continue  # possibly another live server's: never touched
            if state == "created" and now - float(info.get("Created") or now) < CREATED_GRACE_S:
                continue  # another server is between create and start right now
            try:
                client.api.remove_container(info["Id"], force=True)
                log.info("removed orphaned sandbox %s", info["Id"][:12])
            except Exception as exc:
                log.debug("could not remove orphan %s: %s", info["Id"][:12], exc)

    async def reap_orphans(self) -> None:
        """Run the orphan reaping again (ensure_ready does it once)."""
        client = await self._docker.get()
        await anyio.to_thread.run_sync(self._reap_orphans_sync, client)

    async def _remove_leftovers(self) -> None:
        """Shutdown: remove every container labelled with this owner id, tracked or not."""
        if self._docker._client is None:
            return
        client = self._docker.client

        def remove() -> None:
            try:
                found = client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={self.owner_id}"})
            except Exception:
                return
            for info in found:
                try:
                    client.api.remove_container(info["Id"], force=True)
                except Exception:
                    pass

        with anyio.move_on_after(30):
            await anyio.to_thread.run_sync(remove)

    @property
    def cpu_fallback(self) -> tuple[str, str] | None:
        """(why each sandbox keeps a fixed CPU quota, the fix) where quotas cannot be updated in place."""
        return self._cpu.fallback(self.settings.max_sandboxes, self.engine is not None and self.engine.podman)

    @property
    def pool_ready(self) -> int:
        return len(self._pool)

    async def docker_client(self) -> Any:
        """The connected Docker client (tests, diagnostics)."""
        return await self._docker.get()
