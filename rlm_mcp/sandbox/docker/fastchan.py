"""The fast channel: the kernel's frames over a unix socket instead of the Docker attach stream.

The attach stream (the container's stdio through the runc shim, containerd and dockerd) costs
about 0.4 ms a round trip; a unix socket shared with the container costs a few microseconds.
The attach stream stays the trusted channel and the fallback: it carries the kernel's source
and `init`, the kernel's stderr, and its end still tells the kernel that the host is gone.

Where (`unavailable_reason`): only where a host socket can reach the container: a Docker
engine on a local unix socket (not a remote, TLS or ssh DOCKER_HOST, not Docker Desktop's VM),
with runc (gVisor's runsc refuses host unix sockets unless started with --host-uds);
Podman only as root and without SELinux (rootless Podman's user namespace and SELinux's labels
are untested here: the kernel would fall back, after its connect deadline, on every sandbox).
Setting RLM_MCP_SANDBOX_FAST_CHANNEL=off keeps every sandbox on the attach stream.

The socket's directory (`ChannelRoot`): a private parent per server (0700, the server's
user), in it one directory per container (0711) holding the socket (0666), bind-mounted
read-only at MOUNT_AT: nobody else on the host can reach it, and inside the container only
its processes can. The per-container directory goes when the container is removed.

The order, which leaves no frame in doubt about its channel:
1. The host binds and listens before it creates the container, and accepts in a task
   (`FastChannel.accept`) from before `init` is sent.
2. `init`, over the attach stream, names the socket's path and a one-use random token.
3. The kernel connects and sends the token. The host accepts exactly one connection, then
   closes the listener and unlinks the socket's path (nothing else can connect later),
   checks the token in constant time, and only then answers one byte (ACK) and starts
   reading frames from the socket (the same decoder, caps, schema checks and inbox budget
   as the attach stream's). A wrong or late token is closed without an answer.
4. The kernel, on the ACK, starts reading the socket too and writes every frame from `ready`
   on to the socket; without it (no socket, refused, no ACK within the deadline) it writes
   `ready` and everything after on the attach stream, and says why in `ready`. So the
   kernel's frames never use both channels: the host can read both for the container's life.
5. The host writes to the socket only after a `ready` that says so; until then it has sent
   `init` alone and waits for `ready`, so no host frame is in flight on the attach stream
   when its writes switch. The kernel reads both channels for its whole life.
An accepted connection the kernel then does not use (its ACK came too late) is closed by the
host at `ready`; the kernel holds its end open, unused, so that close tells it nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import anyio

from rlm_mcp.config import SandboxSettings
from rlm_mcp.ports.owners import OwnerLiveness
from rlm_mcp.sandbox.docker.engine import EngineInfo, is_gvisor
from rlm_mcp.sandbox.docker.faults import is_refused
from rlm_mcp.sandbox.liveness import LABEL_HOST, LABEL_PID, LABEL_STARTED, process_started

log = logging.getLogger("rlm_mcp.sandbox")

MOUNT_AT = "/run/rlm"  # a mount target Docker creates in the read-only root filesystem
SOCKET_NAME = "k"
TOKEN_HEX = 64  # 32 random bytes, as hex
ACK = b"\x01"
HANDSHAKE_S = 5.0  # the host's to read the token once a connection is accepted
ROOT_PREFIX = "rlm-mcp-chan-"
LABEL_CHANNEL_DIR = "rlm-mcp.channel-dir"  # the container's socket directory, for the orphan reaper
_MOUNT_REFUSALS = ("mount", "not shared", "file sharing", "bind source", "container path")  # the last: Podman's


def is_refused_mount(exc: BaseException) -> bool:
    """The engine refused the socket's bind mount (Docker Desktop: "mounts denied ... not shared")."""
    text = str(getattr(exc, "explanation", None) or exc).lower()
    return is_refused(exc) and any(marker in text for marker in _MOUNT_REFUSALS)


def root_base() -> Path:
    """Where the servers' private parents are made: the temporary directory, or /tmp where that
    path is too long for a unix socket's (108 bytes, with the parent, the directory and the name)."""
    base = Path(tempfile.gettempdir())
    return base if len(str(base)) <= 60 else Path("/tmp")


def own_root_prefix() -> str:
    """The name a server's private parent starts with: the prefix, then its pid and process
    start time (0 where unknown), so another server can tell when it is gone (`remove_dead_roots`)."""
    pid = os.getpid()
    return f"{ROOT_PREFIX}{pid}-{process_started(pid) or 0}-"


def remove_dead_roots(liveness: OwnerLiveness) -> None:
    """Remove the private parents of this host's servers that are gone, with whatever they hold.

    A killed server leaves its parent behind, and the container reaper does not always name it:
    a sandbox whose host died ends and may be gone before any reaper lists it. Only directories
    of our shape (`own_root_prefix`), owned by this user, whose server `liveness` says is gone.
    Blocking: a worker thread's."""
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return
    uid, host = getuid(), socket.gethostname()
    for entry in root_base().glob(f"{ROOT_PREFIX}*"):
        pid, _, rest = entry.name[len(ROOT_PREFIX) :].partition("-")
        started, _, _ = rest.partition("-")
        if not (pid.isdigit() and started.isdigit()):
            continue
        try:
            info = entry.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        labels = {LABEL_HOST: host, LABEL_PID: pid, LABEL_STARTED: "" if started == "0" else started}
        if liveness.owner_gone(labels, idle_s=0.0):
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed a gone server's sandbox socket directory %s", entry)


def remove_orphan_dir(labels: dict[str, str]) -> None:
    """Remove a removed orphan sandbox's socket directory (and its server's parent once empty);
    only a path of the shape this module makes, in the temporary directory, is touched."""
    path = labels.get(LABEL_CHANNEL_DIR)
    if not isinstance(path, str) or not os.path.isabs(path):
        return
    # Normalised first: a label is anyone's with access to the engine, and "<parent>/.." would
    # otherwise pass the shape check below as the temporary directory itself.
    directory = Path(os.path.normpath(path))
    parent = directory.parent
    if parent.parent != root_base() or not parent.name.startswith(ROOT_PREFIX) or directory.is_symlink():
        return
    shutil.rmtree(directory, ignore_errors=True)
    try:
        parent.rmdir()  # only when empty: a live server's other sandboxes keep it
    except OSError:
        pass


def unavailable_reason(settings: SandboxSettings, engine: EngineInfo | None, docker_host: str | None) -> str | None:
    """Why sandboxes cannot use the fast channel here, or None when they can (`auto`)."""
    if settings.sandbox_fast_channel == "off":
        return "RLM_MCP_SANDBOX_FAST_CHANNEL=off"
    if docker_host and not docker_host.startswith("unix://"):
        scheme = docker_host.split("://", 1)[0] if "://" in docker_host else docker_host
        return f"DOCKER_HOST is not a local unix socket ({scheme}://): the engine cannot see this host's sockets"
    if engine is None:
        return "the engine is not known"
    if engine.podman and engine.rootless:
        return "rootless Podman: not supported (its user namespace maps the socket's owner; untested)"
    if engine.podman and engine.selinux:
        return "Podman with SELinux: not supported (the socket's bind mount would need relabelling)"
    if is_gvisor(engine, settings):
        return "gVisor (runsc) does not pass host unix sockets through unless started with --host-uds"
    if engine.desktop:
        return "Docker Desktop runs the engine in a VM: a host unix socket cannot be shared into it"
    return None


class ChannelRoot:
    """The server's private parent directory of the fast channels' sockets (one per backend)."""

    def __init__(self) -> None:
        self._path: Path | None = None
        self._lock = threading.Lock()

    def new_dir(self) -> Path:
        """A fresh directory for one container's socket (blocking: a few syscalls)."""
        with self._lock:
            # Made again when gone (a cleaner of the temporary directory, a reaper that saw it empty).
            if self._path is None or not self._path.is_dir():
                self._path = Path(tempfile.mkdtemp(prefix=own_root_prefix(), dir=root_base()))  # 0700, ours
            parent = self._path
        directory = Path(tempfile.mkdtemp(dir=parent))
        os.chmod(directory, 0o711)  # the container's user may pass through, not list
        return directory

    def close(self) -> None:
        with self._lock:
            path, self._path = self._path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


class FastChannels:
    """The backend's decision about the fast channel, and the one log line per reason it falls back."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self.root = ChannelRoot()
        self.off_reason: str | None = None  # set once the engine is known, or a fallback ruled it out
        self._decided = False
        self._said: set[str] = set()

    def decide(self, engine: EngineInfo | None) -> None:
        """Settle `enabled` once the engine is known (until then: the attach stream)."""
        if not self._decided and (engine is not None or self.off_reason):
            self._decided = True
            docker_host = os.environ.get("DOCKER_HOST")
            self.off_reason = self.off_reason or unavailable_reason(self.settings, engine, docker_host)
            if self.off_reason:
                self.fell_back(self.off_reason)

    @property
    def enabled(self) -> bool:
        return self._decided and self.off_reason is None

    def disable(self, reason: str) -> None:
        """No more fast channels for this backend (the engine refused the mount)."""
        self.off_reason = reason
        self.fell_back(reason)

    def fell_back(self, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            log.info("sandbox frames use the Docker attach stream: %s", reason)

    def describe(self) -> str:
        if self.off_reason:
            return f"frames over the attach stream ({self.off_reason})"
        return "frames over a unix socket (fast channel; the attach stream as fallback)"

    def open(self) -> FastChannel:
        return FastChannel(self.root.new_dir())

    def close(self) -> None:
        self.root.close()


async def _accept_one(listener: socket.socket) -> socket.socket:
    """The next connection on `listener` (non-blocking). Not `loop.sock_accept`: on Python 3.11
    its reader callback, already queued when the await is cancelled (the kernel connecting just
    as its boot is given up), still accepts, fails to set the cancelled future (InvalidStateError
    in the loop) and leaks the connection. Here a cancelled wait accepts nothing."""
    while True:
        await anyio.wait_readable(listener)
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            continue  # a wake-up without a connection, or one gone before it was taken: wait again
        conn.setblocking(False)
        return conn


class FastChannel:
    """One container's socket: listener, the one accepted connection, its directory.

    Blocking set-up (`FastChannel(...)`) may run in a worker thread; `accept` runs on the loop.
    `close_listener` and `remove_dir` are idempotent and never raise.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / SOCKET_NAME
        self.token = secrets.token_hex(TOKEN_HEX // 2)
        self.conn: socket.socket | None = None
        self.refused: str | None = None  # why a connection was turned away
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(str(self.path))
            os.chmod(self.path, 0o666)  # the container's non-root user connects; the parent is private
            self._listener.listen(1)
            self._listener.setblocking(False)
        except BaseException:
            self.close_listener()
            self.remove_dir()
            raise

    @property
    def inside_path(self) -> str:
        return f"{MOUNT_AT}/{SOCKET_NAME}"

    async def accept(self, connected: Callable[[socket.socket], None]) -> None:
        """Accept one connection, check its token, acknowledge and hand it to `connected`."""
        listener = self._listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        conn = await _accept_one(listener)
        self.close_listener()  # exactly one connection: nothing inside can connect after this
        try:
            got = bytearray()
            async with asyncio.timeout(HANDSHAKE_S):
                while len(got) < TOKEN_HEX and (data := await loop.sock_recv(conn, TOKEN_HEX - len(got))):
                    got += data
            if not hmac.compare_digest(bytes(got), self.token.encode("ascii")):
                self.refused = "the connection on the fast channel did not present the token"
                conn.close()
                return
            await loop.sock_sendall(conn, ACK)
        except (OSError, TimeoutError) as exc:
            self.refused = f"the fast channel's handshake failed ({type(exc).__name__})"
            conn.close()
            return
        except BaseException:
            conn.close()
            raise
        conn.setblocking(True)  # the loop reads with MSG_DONTWAIT, the writer thread blocks
        self.conn = conn
        connected(conn)

    def close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        listener.close()

    def remove_dir(self) -> None:
        self.close_listener()
        shutil.rmtree(self.dir, ignore_errors=True)
