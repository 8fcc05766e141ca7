"""The kernel protocol and how a sandbox backend plugs in (docs/architecture.md, "Backends").

A sandbox is a Python kernel (`sandbox/guest/kernel.py`) in an isolated box that some backend
made: a Docker container today, a Kubernetes pod or another runtime tomorrow. The generic
sandbox (`sandbox/session.py`) talks to the kernel through a `KernelChannel` only, in typed
frames; a `SandboxBackend` makes channels, checks its image, reaps and reports capacity.

The wire format (`sandbox/frames.py`): a 4-byte big-endian length, then a UTF-8 JSON object
whose first key is `type`. These dataclasses are that object's fields, one class per type and
direction; `sandbox/frames.py` converts (and checks every kernel frame: it is hostile input).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from rlm_mcp.errors import SandboxError
    from rlm_mcp.events import SubCallKind
    from rlm_mcp.ports.owners import OwnerLiveness


# -- host to kernel ----------------------------------------------------------------------------
@dataclass(frozen=True)
class InitFrame:
    id: int
    output_bytes: int
    max_batch: int
    answer_max_bytes: int
    # The fast channel (rlm_mcp/sandbox/docker/fastchan.py): where its socket is inside the
    # sandbox, the one-use token to present there, and how long to try; None: the attach stream.
    channel_path: str | None = None
    channel_token: str | None = None
    channel_timeout_s: float | None = None
    type: Literal["init"] = "init"


@dataclass(frozen=True)
class ExecFrame:
    id: int
    code: str
    training_cell: bool = False
    type: Literal["exec"] = "exec"


@dataclass(frozen=True)
class InterruptFrame:
    id: int = 0
    type: Literal["interrupt"] = "interrupt"


@dataclass(frozen=True)
class LMResultFrame:
    id: int
    results: list[str] | None  # one string per prompt; None with `error` (the call raises in the cell)
    error: str | None = None
    type: Literal["lm_result"] = "lm_result"


@dataclass(frozen=True)
class LoadContextFrame:
    """Announces a context's bytes, which follow the frame raw (`KernelChannel.send_context`)."""

    index: int
    format: str
    bytes: int
    id: int = 0
    type: Literal["load_context"] = "load_context"


HostFrame = InitFrame | ExecFrame | InterruptFrame | LMResultFrame | LoadContextFrame


# -- kernel to host ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadyFrame:
    id: int | None = None
    snapshots: bool = False  # the image can serialize a kept session's namespace (dill is there)
    channel: Literal["attach", "socket"] = "attach"  # where the kernel writes its frames from now on
    channel_error: str | None = None  # why not the fast channel, when it was offered
    type: Literal["ready"] = "ready"


@dataclass(frozen=True)
class ExecResultFrame:
    id: int
    stdout: str
    stderr: str
    error: str | None
    answer: dict[str, Any] | None  # {"content": str | None, "ready": bool}
    variables: list[str]
    duration: float
    trained_error: str | None = None
    variables_at_start: list[str] | None = None
    type: Literal["exec_result"] = "exec_result"


@dataclass(frozen=True)
class LMRequestFrame:
    id: int
    kind: SubCallKind
    prompts: list[str]
    model: str | None = None
    main: bool = False  # made by the cell's main thread (pauses its running-time clock)
    type: Literal["lm_request"] = "lm_request"


@dataclass(frozen=True)
class LogFrame:
    message: str
    id: int | None = None
    type: Literal["log"] = "log"


@dataclass(frozen=True)
class ContextLoadedFrame:
    index: int
    error: str | None = None
    id: int | None = None
    type: Literal["context_loaded"] = "context_loaded"


KernelFrame = ReadyFrame | ExecResultFrame | LMRequestFrame | LogFrame | ContextLoadedFrame


# -- a channel and a backend -------------------------------------------------------------------
class BackendConnectionLost(Exception):
    """The connection to the backend was lost while starting or talking to a sandbox: worth a
    retry in a fresh sandbox (not the code's doing). `str()` says what was seen."""


@dataclass(frozen=True)
class ChannelEvent:
    """What a channel delivers: a checked frame, or the end of its stream ("eof"), or a
    protocol violation ("violation", the kernel must go). `size`: host bytes it holds."""

    kind: Literal["frame", "eof", "violation"]
    frame: KernelFrame | None = None
    detail: str = ""
    size: int = 0


@dataclass(frozen=True)
class ExitInfo:
    """How a sandbox ended, as far as its backend can tell (Docker: the container state;
    Kubernetes: the pod's container status)."""

    exit_code: int | None = None
    oom_killed: bool = False
    running: bool | None = None  # still running although its stream ended
    lost: str | None = None  # the backend's connection failed while asking: what was seen
    oom_unreported: bool = False  # the backend never reports OOM kills (Podman 4.3, cgroup v1)


class KernelChannel(Protocol):
    """One started kernel: frames in both directions, its end explained. Made by a backend."""

    name: str
    closed: bool  # this host ended it
    eof: bool  # its stream ended (the kernel is gone or going)
    snapshots: bool  # its kernel said at boot that it can snapshot a namespace (dill in the image)

    def new_id(self) -> int: ...

    async def send(self, frame: HostFrame) -> None:
        """Write one frame. Raises BrokenPipeError when the kernel's input is closed."""
        ...

    async def send_raw(self, data: bytes) -> None:
        """Write bytes that are not a frame: the kernel's source, read by the bootstrap."""
        ...

    async def send_context(self, index: int, path: Path, fmt: str) -> None:
        """Write a `LoadContextFrame` and then the file's bytes raw."""
        ...

    async def receive(self) -> ChannelEvent: ...

    async def exit_info(self) -> ExitInfo:
        """How the sandbox ended (waits a moment for it to end)."""
        ...

    def lost_reason(self, info: ExitInfo) -> str | None:
        """Why the sandbox's end is the backend connection's fault (retry in a fresh one), or None."""
        ...

    def close(self) -> None:
        """End the stream (the kernel exits on input EOF); idempotent, never raises."""
        ...

    async def remove(self) -> None:
        """Delete the sandbox itself; idempotent, never raises."""
        ...

    async def kill(self) -> None:
        """`close()` then `remove()`."""
        ...


class SandboxBackend(Protocol):
    """Makes kernel sandboxes: Docker (`sandbox/docker/backend.py`), a Kubernetes pod later."""

    name: str  # "docker": named in messages and by `rlm-mcp doctor`

    async def describe(self) -> str:
        """Reach the backend and say what it is (`rlm-mcp doctor`: "engine 28.2 (API 1.50)").
        Raises `BackendUnavailableError` with the fix."""
        ...

    async def check_ready(self) -> None:
        """Reach the backend and check the image (or template). Raises `BackendUnavailableError`
        or `ImageMissingError` with the fix."""
        ...

    async def check_limits(self, timeout_s: float) -> None:
        """Reach the backend within `timeout_s` and refuse one that cannot enforce the sandbox's
        memory, pids and CPU limits (`SandboxError` with the reason and the fix): `serve` calls it
        at start. Raises `BackendUnavailableError`, or `TimeoutError`, when it cannot be reached."""
        ...

    async def start(self, owner_id: str) -> KernelChannel:
        """A new sandbox labelled with `owner_id`, its kernel ready. Raises `SandboxError`
        (or `BackendConnectionLost`, retryable) when it cannot."""
        ...

    async def reap(self, liveness: OwnerLiveness, owner_id: str) -> None:
        """Remove stopped sandboxes whose owner `liveness` says is gone (never `owner_id`'s)."""
        ...

    async def remove_owned(self, owner_id: str) -> None:
        """Remove every sandbox labelled with `owner_id` (shutdown)."""
        ...

    async def capacity_cpus(self) -> float | None:
        """CPUs the backend's sandboxes share (None: unknown)."""
        ...

    async def set_cpus(self, channel: KernelChannel, cpus: float) -> None:
        """Change a running sandbox's CPU limit in place. Raises `CpuLimitFixed` (why, and the
        fix) when the backend cannot change limits in place at all: the CPU shares then switch off
        and each sandbox keeps the limit it was created with, saying so (`sandbox/cpu.py`). Any
        other failure (the sandbox is gone, the connection dropped) is raised as it is; the
        shares log it and try again at the next change."""
        ...

    def lost_error(self, attempts: int, detail: str) -> SandboxError:
        """The run's end when the backend stays out of reach after `attempts` tries in a row
        (a `ConnectionLostError` naming what to check)."""
        ...

    def close(self) -> None: ...
