"""One sandbox container: its attach stream, its reader (rlm_mcp.sandbox.docker.attach) and its
writer (writer.py).

On a plain socket the stream is read on the event loop; otherwise a reader thread hands over
with `call_soon_threadsafe`, never waiting for the loop.

With the fast channel (fastchan.py, which says in what order the switch happens) the kernel's
frames travel over a unix socket instead, read by a second `LoopReader` into the same inbox;
the attach stream stays attached for the container's life (its stderr, its end).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import uuid
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import RlmMcpError, SandboxError
from rlm_mcp.ports.kernel import ChannelEvent, ExitInfo, HostFrame, ReadyFrame
from rlm_mcp.sandbox.boot import ANSWER_MAX_BYTES, BOOT_TIMEOUT_S, boot_kernel
from rlm_mcp.sandbox.docker.attach import AttachReader, open_raw_reader, open_reader, plain_socket
from rlm_mcp.sandbox.docker.docker_api import docker_errors, image_missing, short
from rlm_mcp.sandbox.docker.engine import EngineInfo, check_container_runtime
from rlm_mcp.sandbox.docker.fastchan import LABEL_CHANNEL_DIR, MOUNT_AT, FastChannel, FastChannels, is_refused_mount
from rlm_mcp.sandbox.docker.faults import (
    EXIT_INPUT_CLOSED,
    DockerConnectionLost,
    boot_failure,
    is_gone,
    is_lost,
    lost_raised,
    stopped_while_removed,
)
from rlm_mcp.sandbox.docker.hardening import create_kwargs
from rlm_mcp.sandbox.docker.lean_calls import calls
from rlm_mcp.sandbox.docker.writer import ContextJob, FrameWriter
from rlm_mcp.sandbox.frames import encode_frame, max_frame_strings, max_kernel_frame
from rlm_mcp.sandbox.inbox import ByteBudget, Inbox

log = logging.getLogger("rlm_mcp.sandbox")

INBOX_BYTES = 64 << 20  # kernel frames parsed but not yet handled, in estimated host bytes
# How long a removal is waited for; past it Docker's answer is left to its thread (the call's
# own read timeout ends it) and the owner's sweep at shutdown removes what is left.
REMOVE_WAIT_S = 20.0


class KernelContainer:
    """A started container running the kernel: the Docker `KernelChannel` (rlm_mcp.ports.kernel).
    Create with `await KernelContainer.start(...)`."""

    def __init__(self, client: Any, settings: SandboxSettings, owner_id: str, engine: EngineInfo | None = None) -> None:
        self.client = client
        self.engine = engine
        self.settings = settings
        self.owner_id = owner_id
        self.name = f"rlm-mcp-{owner_id[:8]}-{uuid.uuid4().hex[:10]}"
        self.id: str | None = None
        self._sock: Any = None
        self._raw: Any = None
        self._plain: socket.socket | None = None  # _raw, when it is a plain socket (attach.plain_socket)
        self._chan: FastChannel | None = None
        self._chan_reader: AttachReader | None = None
        self.channel = "attach"  # where the kernel's frames travel: "attach" or "socket"
        self._loop: asyncio.AbstractEventLoop
        self._inbox = Inbox()
        self._budget = ByteBudget(INBOX_BYTES)
        self._writer = FrameWriter(self.name, self)
        self._reader: AttachReader | None = None
        self.stream_error: BaseException | None = None  # what broke the attach stream, if anything did
        self.eof = False
        self.snapshots = False  # set from the kernel's `ready` frame
        self.closed = False
        self.output_bytes = settings.cell_output_bytes
        self.max_frame = max_kernel_frame(self.output_bytes, ANSWER_MAX_BYTES)
        self.max_strings = max_frame_strings(settings.max_prompts_per_batch)
        self._next_id = 0
        self._create_sent = False
        self._removed = False

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def calls(self) -> Any:
        """Where this sandbox's own API calls go (lean_calls.py)."""
        return calls(self.client)

    @classmethod
    async def start(
        cls,
        client: Any,
        settings: SandboxSettings,
        owner_id: str,
        engine: EngineInfo | None = None,
        channels: FastChannels | None = None,
    ) -> KernelContainer:
        """Create, attach, start, boot the kernel and wait for `ready`. Kills it on failure."""
        self = cls(client, settings, owner_id, engine)
        self._loop = asyncio.get_running_loop()
        ok = False
        accepting: asyncio.Task[None] | None = None
        try:
            if channels is not None and channels.enabled:
                try:
                    self._chan = await anyio.to_thread.run_sync(channels.open)
                except OSError as exc:  # no socket here (a full disk, a path too long): the attach stream
                    channels.disable(f"no socket for the fast channel ({exc})")
            await anyio.to_thread.run_sync(self._create_and_attach, channels)
            self.open_stream(self._raw)
            chan = self._chan
            if chan is not None:
                accepting = self._loop.create_task(chan.accept(self._on_channel))
            event = await boot_kernel(self, settings, chan.inside_path if chan else None, chan.token if chan else None)
            if not isinstance(event.frame, ReadyFrame):
                state = await self.exit_info() if event.kind == "eof" else ExitInfo()
                if lost := self.lost_reason(state):
                    raise DockerConnectionLost(lost)
                raise boot_failure(self._why(event), state, settings, _start_fix(settings))
            self.snapshots = event.frame.snapshots
            if chan is not None and channels is not None:
                self._settle_channel(event.frame, chan, channels)
            ok = True
            return self
        except TimeoutError:
            raise SandboxError(
                f"The sandbox kernel did not report ready within {BOOT_TIMEOUT_S:g} s.", _start_fix(settings)
            ) from None
        except BrokenPipeError as exc:  # its input closed while the kernel was being sent
            if lost := self.lost_reason(await self.exit_info()):
                raise DockerConnectionLost(lost) from None
            raise SandboxError(f"The sandbox kernel did not start ({exc}).", _start_fix(settings)) from None
        finally:
            if accepting is not None:
                # Waited for: its pending accept's watch on the listener goes before the listener
                # closes (a closed fd's number may be reused by the next socket at once).
                accepting.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.wait([accepting])
            if self._chan is not None:
                self._chan.close_listener()
            if not ok:
                with anyio.CancelScope(shield=True):
                    await self.kill()

    def _on_channel(self, conn: socket.socket) -> None:
        """The kernel connected with the token: read its frames from the socket as well."""
        if self.closed:
            conn.close()
            return
        self._chan_reader = open_raw_reader(conn, self, self._inbox, self._budget, self.max_frame, self.max_strings)
        self._chan_reader.start()

    def _settle_channel(self, ready: ReadyFrame, chan: FastChannel, channels: FastChannels) -> None:
        """After `ready`: write to the socket when the kernel writes there, else drop the socket."""
        if ready.channel == "socket" and chan.conn is not None:
            self._writer.switch(chan.conn)  # nothing is in flight: the host sent only `init` so far
            self.channel = "socket"
            return
        if ready.channel == "socket":
            raise SandboxError(
                "The sandbox kernel claimed a fast channel the host never accepted.", _start_fix(self.settings)
            )
        channels.fell_back(
            f"the kernel could not use the fast channel ({ready.channel_error or chan.refused or 'no reason given'})"
        )
        self._drop_channel()

    def _drop_channel(self) -> None:
        reader, self._chan_reader = self._chan_reader, None
        if reader is not None:
            reader.stop()
        if self._chan is not None and self._chan.conn is not None:
            self._chan.conn.close()

    def open_stream(self, raw: Any) -> None:
        """Start reading and writing the attach stream `raw` (on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._raw = raw
        self._plain = plain_socket(raw)
        self._reader = open_reader(raw, self.name, self, self._inbox, self._budget, self.max_frame, self.max_strings)
        self._reader.start()
        self._writer.start(raw, self._plain)

    def _why(self, event: ChannelEvent) -> str:
        if event.frame is not None:
            return f"unexpected {event.frame.type} frame"
        tail = self.stderr_tail()
        return (event.detail or event.kind) + (f"; its stderr: {tail[-500:]}" if tail else "")

    def _create_and_attach(self, channels: FastChannels | None = None) -> None:
        def refused(exc: Exception) -> RlmMcpError:
            import docker.errors

            if isinstance(exc, docker.errors.ImageNotFound):  # removed since `check_ready` found it
                return image_missing(self.settings.sandbox_image)
            explanation = getattr(exc, "explanation", None) or exc
            return SandboxError(f"Docker refused to start a sandbox: {explanation}.", _start_fix(self.settings))

        # No look at the image first (a round trip per start): the create's own answer says
        # when it is gone.
        with lost_raised(), docker_errors(refused):
            try:
                self._create_attach_start()
            except Exception as exc:
                if self._chan is None or channels is None or not is_refused_mount(exc):
                    raise
                # Docker Desktop ("mounts denied") and the like: once more without the socket, for good.
                channels.disable(f"Docker refused the fast channel's bind mount ({short(exc)})")
                self._discard_created()
                self._chan.remove_dir()
                self._chan = None
                self._create_attach_start()

    def _create_attach_start(self) -> None:
        kwargs = create_kwargs(self.client, self.settings, self.owner_id, self.name, self.engine)
        if self._chan is not None:
            kwargs["host_config"]["Binds"] = [f"{self._chan.dir}:{MOUNT_AT}:ro"]
            kwargs["labels"][LABEL_CHANNEL_DIR] = str(self._chan.dir)
        self._create_sent = True
        self.id = self.calls.create_container(**kwargs)["Id"]
        check_container_runtime(self.calls.inspect_container(self.id), self.engine, self.settings)
        # Attach BEFORE start, so no byte of stdout is missed and stdin is held open.
        self._sock = self.calls.attach_socket(self.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        self._raw = getattr(self._sock, "_sock", self._sock)
        self.calls.start(self.id)

    def _discard_created(self) -> None:
        """Undo a `_create_attach_start` that failed part-way (blocking)."""
        self._close_socket()
        self._sock = self._raw = None
        self._remove_sync()
        self.id = None

    async def kill(self) -> None:
        """Kill and remove the container and stop its threads. Idempotent; never raises."""
        self.close()
        await self.remove()

    def close(self) -> None:
        """Stop the threads and close the attach stream (the kernel exits on stdin EOF); no Docker call.

        Idempotent, never raises. The container itself is left for `remove()`.
        """
        if self.closed:
            return
        self.closed = True
        self._budget.close()
        self._writer.stop()
        try:
            if self._reader is not None:
                self._reader.stop()  # before the socket closes: the loop must not watch a closed fd
            if self._chan_reader is not None:
                self._chan_reader.stop()
        finally:
            self._close_socket()

    async def remove(self) -> None:
        """Force-remove the container (a Docker round trip, ~0.2 s). Idempotent; never raises."""
        if self._removed:
            return
        self._removed = True
        # A create whose answer was lost (client read timeout on a slow daemon, cancellation)
        # may still have made the container: remove it by its unique name, or it leaks.
        if self.id is not None or self._create_sent:
            # Abandoned at the bound: a thread's call cannot be cancelled, so without it the
            # bound would only start to count once Docker answered.
            with anyio.move_on_after(REMOVE_WAIT_S) as waited:
                await anyio.to_thread.run_sync(self._remove_sync, abandon_on_cancel=True)
            if waited.cancelled_caught:
                log.warning(
                    "sandbox %s: Docker did not answer its removal within %g s; it is left to finish in the background",
                    self.name,
                    REMOVE_WAIT_S,
                )
        if self._chan is not None:
            self._chan.remove_dir()

    def _close_socket(self) -> None:
        # shutdown() first: close() alone does not end the connection while the reader thread
        # sits in recv() on it (Linux keeps the file open), so the daemon never saw stdin close
        # and, when the remove failed (slow or unreachable daemon), the container ran on.
        shutdown = getattr(self._raw, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown(socket.SHUT_RDWR)
            except Exception:
                pass
        conn = self._chan.conn if self._chan is not None else None
        for obj in (conn, self._raw, self._sock):
            if obj is None:
                continue
            try:
                obj.close()
            except Exception:
                pass

    def _remove_sync(self) -> None:
        try:
            try:
                self.calls.remove_container(self.id or self.name, force=True)
            except Exception as exc:
                if not stopped_while_removed(exc):
                    raise
                self.calls.remove_container(self.id or self.name, force=True)  # stopped now: once more
        except Exception as exc:  # already gone, or the daemon is down: nothing more to do
            if not is_gone(exc):
                log.warning("could not remove sandbox %s: %s", self.name, exc)

    async def exit_info(self) -> ExitInfo:
        """How the (stopping) container ended, from its Docker state. Waits a moment for the exit.
        `lost` says why when the Docker connection failed while asking."""

        def inspect() -> ExitInfo:
            try:
                try:
                    self.client.api.wait(self.id, timeout=3)
                except Exception:
                    pass
                info = exit_info_of(self.calls.inspect_container(self.id).get("State"))
                podman = self.engine is not None and self.engine.podman  # never reports OOM kills (engine.py)
                return dataclasses.replace(info, oom_unreported=True) if podman else info
            except Exception as exc:
                return ExitInfo(lost=short(exc)) if is_lost(exc) else ExitInfo()

        if self.id is None:
            return ExitInfo()
        with anyio.move_on_after(10):  # abandoned at the bound, as a removal is (`remove`)
            return await anyio.to_thread.run_sync(inspect, abandon_on_cancel=True)
        return ExitInfo()

    def lost_reason(self, state: ExitInfo) -> str | None:
        """Why this container's end is the Docker connection's fault, or None. `state`: `exit_info()`
        once its stream ended. The kernel exits with an EXIT_INPUT_CLOSED status when its stdin
        closes, which the daemon does when the attach stream drops, and only we close it otherwise;
        a container still running after its stream ended (exit_info waited) lost the stream."""
        if self.closed:  # we ended it ourselves
            return None
        if self.stream_error is not None and is_lost(self.stream_error):
            return f"the attach stream failed: {self.stream_error}"
        if state.lost is not None:
            return f"the Docker API connection failed: {state.lost}"
        if state.oom_killed:
            return None
        if state.exit_code in EXIT_INPUT_CLOSED:
            return "the attach stream to the sandbox was cut, so its kernel's input closed"
        if state.running is True:  # our end of the stream closed, yet the kernel runs on
            return "the attach stream to the sandbox was cut while it ran"
        return None

    # -- frames ----------------------------------------------------------------------------
    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def send(self, frame: HostFrame) -> None:
        await self.send_raw(encode_frame(frame))

    async def send_raw(self, data: bytes) -> None:
        await self._submit(data)

    async def send_context(self, index: int, path: Path, fmt: str) -> None:
        """Send one context file: a load_context frame, then its bytes raw (off-loop)."""
        await self._submit(("context", index, path, fmt))

    async def _submit(self, job: bytes | ContextJob) -> None:
        if self.closed:
            raise BrokenPipeError("sandbox closed")
        await self._writer.submit(job)

    async def receive(self) -> ChannelEvent:
        event = await self._inbox.get()
        self._budget.release(event.size)
        if self._reader is not None:
            self._reader.consumed()
        if self._chan_reader is not None:
            self._chan_reader.consumed()
        return event

    def stderr_tail(self) -> str:
        stderr = self._reader.demux.stderr if self._reader is not None else b""
        return bytes(stderr).decode("utf-8", "replace")


def exit_info_of(state: Any) -> ExitInfo:
    """Docker's container `State` (hostile: only well-typed fields count) as an `ExitInfo`."""
    if not isinstance(state, dict):
        return ExitInfo()
    code = state.get("ExitCode")
    running = state.get("Running")
    return ExitInfo(
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        oom_killed=state.get("OOMKilled") is True,
        running=running if isinstance(running, bool) else None,
    )


def _start_fix(settings: SandboxSettings) -> str:
    return (
        f"Check that the image {settings.sandbox_image} runs python3 (rebuild it with `rlm-mcp image build "
        "--offline`) and that Docker has free memory."
    )
