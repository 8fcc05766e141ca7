"""`SandboxManager`: the sandbox layer as the service uses it.

It owns a `SandboxBackend` (Docker today: `sandbox/docker/`), the warm pool and every sandbox it
started (labelled with its owner id), and removes them all on exit. Several servers share one
backend: at start it reaps only stopped sandboxes whose owning process is gone (`liveness.py`),
never a live server's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType

import anyio

from rlm_mcp.config import TEXT_MEMORY_FACTOR, SandboxSettings, sandbox_usable_bytes
from rlm_mcp.errors import SandboxError, contexts_over_sandbox_memory
from rlm_mcp.observability import metrics
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.kernel import KernelChannel, SandboxBackend
from rlm_mcp.ports.owners import OwnerLiveness
from rlm_mcp.sandbox.cpu import CpuShares
from rlm_mcp.sandbox.liveness import ProcessLiveness
from rlm_mcp.sandbox.pool import WarmPool
from rlm_mcp.sandbox.quiet import QuietGate, refill_wait_s
from rlm_mcp.sandbox.recovery import LostCount, start_loaded
from rlm_mcp.sandbox.session import KernelSandbox
from rlm_mcp.sandbox.slots import SandboxSlots

log = logging.getLogger("rlm_mcp.sandbox")

BACKGROUND_REMOVALS = 8  # used containers being removed after their run returned, at most


def _configured(settings: SandboxSettings) -> SandboxBackend:
    from rlm_mcp.sandbox.backends import backend_for  # the one import of a backend (see backends.py)

    return backend_for(settings)


def estimate_context_memory(spec: ContextSpec) -> int:
    """Peak bytes a context needs inside the sandbox while it loads (chunks + joined value)."""
    if spec.format == "json":
        # The text, then the parsed objects: Python objects take several times the JSON size.
        return spec.bytes * 2 + spec.bytes * 6
    width = 1 if spec.bytes <= spec.chars else 4  # ASCII: 1 byte per char; otherwise up to 4
    return TEXT_MEMORY_FACTOR * spec.chars * width


class SandboxManager:
    """Opens sandboxes for runs (a `SandboxFactory`), with a warm pool and owned cleanup.

    Enter and leave it in one task (it holds the pool's task group), e.g. in the server lifespan.
    """

    def __init__(
        self,
        settings: SandboxSettings,
        *,
        owner_id: str | None = None,
        liveness: OwnerLiveness | None = None,
        backend: SandboxBackend | None = None,
    ) -> None:
        self.settings = settings
        self.liveness: OwnerLiveness = liveness or ProcessLiveness()
        self.owner_id = owner_id or settings.instance_id or secrets.token_hex(8)
        self.backend: SandboxBackend = backend or _configured(settings)
        self._ready = False
        self._ready_lock = anyio.Lock()
        # Not a CapacityLimiter (one task may hold several); grants keep room for descendants.
        self._slots = SandboxSlots(settings.max_sandboxes)
        self._live: set[KernelChannel] = set()
        self._retired: set[KernelChannel] = set()  # closed after use, removal pending
        self._cpu = CpuShares(settings.sandbox_cpus, self.backend.set_cpus)
        self._cpu.max_sandboxes = settings.max_sandboxes
        # As many as can end together: a burst of runs ending at once must not wait for Docker
        # (a removal under load takes ~0.3 s) before returning their results.
        self._removals = anyio.Semaphore(max(BACKGROUND_REMOVALS, settings.max_sandboxes))
        # Pool refills and background removals wait until no run is using a sandbox (quiet.py).
        self._quiet = QuietGate()
        self._pool = WarmPool(settings.pool_size, self._start_container, self._discard, quiet=self._refill_quiet)
        self._tg: anyio.abc.TaskGroup | None = None
        self._exit_stack: contextlib.AsyncExitStack | None = None
        # Frees a slot held by something idle (a kept session's REPL between its runs) when a
        # sandbox must open and none is free; returns whether it freed one (service/sessions.py).
        self.reclaim: Callable[[], Awaitable[bool]] | None = None
        self._starting = 0
        # Whether this image's kernels can snapshot a namespace (their `ready` frame says): None
        # until one has booted. The image is fixed for the manager's life.
        self._snapshots: bool | None = None
        self._snapshots_lock = anyio.Lock()
        metrics.watch_sandboxes(self)

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
                await self.backend.remove_owned(self.owner_id)
                self.backend.close()

    async def ensure_ready(self) -> None:
        """Reach the backend, check the image, reap orphans once, start the pool refill."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            await self.backend.check_ready()
            await self.backend.reap(self.liveness, self.owner_id)
            total = self.settings.sandbox_total_cpus
            if total is None:
                total = await self.backend.capacity_cpus() or float(os.cpu_count() or 1)
            self._cpu.total = total
            if self._tg is not None:
                self._tg.start_soon(self._cpu.run)
                if self.settings.pool_size > 0:
                    self._tg.start_soon(self._pool.refill_forever)
            self._ready = True

    async def check_snapshots(self) -> None:
        """Refuse a kept session (`SandboxError` with the fix) when the image has no dill: its
        namespace could not outlive its sandbox. Known from the first kernel that booted; when none
        has yet, one is started now and kept warm in the pool (or removed when the pool is full)."""
        await self.ensure_ready()
        async with self._snapshots_lock:
            if self._snapshots is None:
                container = await self._start_container()
                if not self._pool.offer(container):
                    await self._discard(container)
        if not self._snapshots:
            image = self.settings.sandbox_image
            raise SandboxError(
                f"Kept sessions need dill (python3-dill) in the sandbox image, and {image} has none: a "
                "session's namespace could not be saved when its sandbox is given back.",
                "Rebuild the image with `rlm-mcp image build` (or `rlm-mcp image build --offline` where no "
                "registry is reachable; both install python3-dill), or add python3-dill to your own image; "
                "or ask without keep_session/session_id.",
            )

    @property
    def can_snapshot(self) -> bool | None:
        """Whether this image's kernels can snapshot a namespace (dill); None until one has booted."""
        return self._snapshots

    def check_fits(self, contexts: Sequence[ContextSpec]) -> None:
        need = sum(estimate_context_memory(spec) for spec in contexts)
        usable = sandbox_usable_bytes(self.settings.sandbox_memory)
        if need > usable:
            raise contexts_over_sandbox_memory(need, usable, self.settings.sandbox_memory)

    def open(
        self, contexts: Sequence[ContextSpec], *, levels_below: int = 0, kept: bool = False
    ) -> AbstractAsyncContextManager[KernelSandbox]:
        """A sandbox with `contexts` loaded; `levels_below`: how many levels of child runs (each with
        a sandbox) the run using it may still start, so that the slot cap cannot deadlock. `kept`:
        it outlives its run (a kept session): it holds its slot but does not hold back the pool's
        refills and removals while it idles."""
        return self._open(list(contexts), levels_below, kept)

    @contextlib.asynccontextmanager
    async def _open(self, contexts: list[ContextSpec], levels_below: int, kept: bool) -> AsyncIterator[KernelSandbox]:
        await self.ensure_ready()
        self.check_fits(contexts)
        while self._slots.free < levels_below + 1 and self.reclaim is not None and await self.reclaim():
            pass  # idle kept sessions give their slots back, least recently used first
        quiet = contextlib.nullcontext() if kept else self._quiet.in_use()
        async with self._slots.hold(levels_below), quiet:
            sandbox: KernelSandbox | None = None
            container = await start_loaded(
                self._acquire, self._discard, contexts, self.settings, LostCount(self.backend.lost_error)
            )
            try:
                sandbox = KernelSandbox(
                    self.settings, contexts, container, self._acquire, self._retire, self.backend.lost_error
                )
                yield sandbox
            finally:
                with anyio.CancelScope(shield=True):
                    if sandbox is not None:
                        await sandbox.close()  # retires the container it holds (this one or a replacement)
                    else:
                        await self._retire(container)

    # -- containers ------------------------------------------------------------------------
    async def _refill_quiet(self) -> None:
        """What the pool's refill waits for while it still holds a container (quiet.py): the long
        wait only while it holds at least half its size, so a burst that drains it finds the
        refill started within the gate's own bound rather than meeting cold starts."""
        await self._quiet.wait_quiet(refill_wait_s(len(self._pool), self._pool.size))

    async def _acquire(self) -> KernelChannel:
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

    async def _start_container(self) -> KernelChannel:
        self._starting += 1
        began = time.perf_counter()
        try:
            container = await self.backend.start(self.owner_id)
        except BaseException as exc:
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                metrics.sandbox_start(None)
            raise
        finally:
            self._starting -= 1
        metrics.sandbox_start(time.perf_counter() - began)
        self._snapshots = container.snapshots
        self._live.add(container)
        try:
            # Can limits change in place here? (else: fixed, announced). Once; later starts return at
            # once, but a start made while the first one asks waits for its answer.
            await self._cpu.probe(container, self.settings.max_sandboxes)
        except BaseException:  # cancelled while it waited (its run was): nobody holds it, so it goes
            await self._discard(container)
            raise
        return container

    async def _discard(self, container: KernelChannel) -> None:
        with anyio.CancelScope(shield=True):
            await container.kill()
            await self._cpu.remove(container)  # the others' shares grow back
            self._live.discard(container)
            self._retired.discard(container)

    async def _retire(self, container: KernelChannel) -> None:
        """Take a used container out of the CPU shares now; close it and remove it from Docker in
        the background.

        The removal is a ~0.2 s Docker round trip the caller (a finishing run, or a child run whose
        parent waits for its answer) need not wait for, and so is the close: it wakes the
        container's reader and writer threads, and the kernel's exit sets Docker's daemon to work,
        all while the run's answer is on its way (timestamps on the 2-core VM: 0.2-5.9 ms on a
        one-turn run's path). At most `_removals` run in the background; past that the caller
        removes it itself, so a burst of runs cannot pile up dead containers. Shutdown removes
        whatever is still pending.
        """
        if container in self._retired:
            return  # retired once already: a second removal would take a second slot
        self._retired.add(container)
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

    async def _remove_in_background(self, container: KernelChannel) -> None:
        try:
            await self._quiet.wait_quiet()
            await self._discard(container)  # closes it, then removes it
        finally:
            self._removals.release()

    def sandbox_counts(self) -> tuple[int, int, int]:
        """(held by runs, warm in the pool, starting): what the sandbox gauge reports."""
        warm = len(self._pool)
        held = len(self._live) - len(self._retired) - warm
        return max(0, held), warm, self._starting

    @property
    def free_slots(self) -> int:
        """Sandboxes that may still open now (RLM_MCP_MAX_SANDBOXES less those open)."""
        return self._slots.free

    @property
    def max_slots(self) -> int:
        return self._slots.capacity

    @property
    def cpu_fallback(self) -> tuple[str, str] | None:
        """(why each sandbox keeps a fixed CPU limit, the fix) where limits cannot change in place."""
        return self._cpu.fallback(self.settings.max_sandboxes)
