"""Why a sandbox ended, and getting a fresh one with the contexts loaded.

A container whose kernel died is explained to the model (out of memory, a signal, an exit, a
protocol violation, or the connection to the container engine lost); `start_loaded` gives a run a
new container with its contexts, retrying a bounded number of times while that connection is lost.
The words are the engine's neutral ones (Docker, Podman, ...: `rlm-mcp doctor` names it); only
the backend's own final error (`SandboxBackend.lost_error`) names its engine and its fix.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import SandboxError
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.kernel import BackendConnectionLost, ContextLoadedFrame, KernelChannel, LogFrame

log = logging.getLogger("rlm_mcp.sandbox")

# Consecutive sandbox replacements one run may make because the backend connection was lost
# (a cell that then completes resets the count); past this the run ends with `ConnectionLostError`.
MAX_CONNECTION_RESTARTS = 5
RESTART_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 4.0)  # before the 1st, 2nd, ... retry in a row


class ContainerLost(Exception):
    """The container is gone or must go; `reason` is written for the model. `lost`: because the
    connection to the container engine was lost (not the code's doing); `oom`: its memory limit killed it."""

    def __init__(self, reason: str, *, lost: bool = False, oom: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.lost = lost
        self.oom = oom


async def death(container: KernelChannel, settings: SandboxSettings, kind: str, detail: str) -> ContainerLost:
    """What ended `container`'s stream (`kind`/`detail` from its last event), for the model."""
    if kind == "violation":
        return ContainerLost(f"The sandbox broke the host protocol ({detail}).")
    state = await container.exit_info()
    if state.oom_killed:
        return ContainerLost(
            f"The sandbox ran out of memory (limit {settings.sandbox_memory}, RLM_MCP_SANDBOX_MEMORY) and its "
            "Python process was killed. Process the context in smaller pieces.",
            oom=True,
        )
    lost = container.lost_reason(state)
    if lost is not None:
        return ContainerLost(
            f"The connection to the container engine was lost ({lost}), which ended the sandbox.", lost=True
        )
    code = state.exit_code
    if code == 128 + 9 and state.oom_unreported:  # a SIGKILL where OOM kills go unreported
        return ContainerLost(
            f"The sandbox's Python process was killed by signal 9 (exit status {code}): most likely it ran out of "
            f"memory (limit {settings.sandbox_memory}, RLM_MCP_SANDBOX_MEMORY; this engine does not report "
            "out-of-memory kills). Process the context in smaller pieces.",
            oom=True,
        )
    if isinstance(code, int) and code > 128:
        return ContainerLost(f"The sandbox's Python process was killed by signal {code - 128} (exit status {code}).")
    if isinstance(code, int):
        return ContainerLost(
            f"The sandbox's Python process exited (exit status {code}; e.g. os._exit, or its protocol streams were closed)."
        )
    return ContainerLost(f"The sandbox stopped unexpectedly ({detail}).")


async def load_contexts(
    container: KernelChannel, contexts: Sequence[ContextSpec], settings: SandboxSettings, *, start: int = 0
) -> None:
    """Stream every context into the kernel as context_{start}, context_{start+1}, ... and wait
    until each is bound. Raises `ContainerLost`."""
    try:
        for index, spec in enumerate(contexts, start):
            await container.send_context(index, spec.path, spec.format)
    except BrokenPipeError as exc:
        raise await death(container, settings, "eof", str(exc)) from None
    pending = set(range(start, start + len(contexts)))
    while pending:
        event = await container.receive()
        frame = event.frame
        if event.kind != "frame" or frame is None:
            raise await death(container, settings, event.kind, event.detail)
        if isinstance(frame, LogFrame):
            continue
        if not isinstance(frame, ContextLoadedFrame) or frame.index not in pending:
            raise ContainerLost(f"The sandbox broke the protocol while loading contexts ({frame.type}).")
        if frame.error:
            log.warning("context %s: %s", frame.index, frame.error)
        pending.discard(frame.index)


class LostCount:
    """Consecutive sandbox losses of one run to the engine connection; a completed cell resets it."""

    def __init__(self, lost_error: Callable[[int, str], SandboxError]) -> None:
        self.in_row = 0
        self._lost_error = lost_error  # the backend's words for it (SandboxBackend.lost_error)

    async def another(self, detail: str) -> None:
        """Count one more; wait before the retry, or raise `ConnectionLostError` past the bound."""
        self.in_row += 1
        if self.in_row > MAX_CONNECTION_RESTARTS:
            raise self._lost_error(self.in_row, detail)
        log.info("container engine connection lost (%s); retry %d in a fresh sandbox", detail, self.in_row)
        await anyio.sleep(RESTART_BACKOFF_S[min(self.in_row, len(RESTART_BACKOFF_S)) - 1])


async def start_loaded(
    acquire: Callable[[], Awaitable[KernelChannel]],
    discard: Callable[[KernelChannel], Awaitable[None]],
    contexts: Sequence[ContextSpec],
    settings: SandboxSettings,
    lost: LostCount,
) -> KernelChannel:
    """A started container with `contexts` loaded. While the engine connection is lost it retries
    (counted in `lost`); other failures raise `SandboxError` naming their cause."""
    while True:
        container: KernelChannel | None = None
        ok = False
        try:
            try:
                container = await acquire()
                await load_contexts(container, contexts, settings)
            except BackendConnectionLost as exc:
                detail = str(exc)
            except ContainerLost as exc:
                if not exc.lost:
                    fix = (
                        "Raise RLM_MCP_SANDBOX_MEMORY or load smaller contexts."
                        if exc.oom
                        else "Check the container engine's log (`rlm-mcp doctor` names the engine); "
                        "the run can be started again."
                    )
                    raise SandboxError(f"The sandbox failed while loading the contexts: {exc.reason}", fix) from None
                detail = exc.reason
            else:
                ok = True
                return container
        finally:
            if not ok and container is not None:
                with anyio.CancelScope(shield=True):
                    await discard(container)
        await lost.another(detail)
