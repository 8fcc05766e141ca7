"""What a Docker failure means: the connection to the daemon was lost, or the daemon said no.

The one place in the code base that recognises Docker failures: everything else asks
these functions.

The one place that decides it, for the API calls (docker-py over requests/urllib3) and for the
attach stream (a raw socket) alike. A lost connection (a restarted daemon, a dropped SSH tunnel
or socket proxy, a reset mid-request) is worth retrying in a fresh sandbox; an answer from the
daemon (an `APIError`: no such image, out of space, bad request) is not, and keeps its own text.
"""

from __future__ import annotations

import errno
import http.client
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import ConnectionLostError, DockerUnavailableError, SandboxError
from rlm_mcp.ports.kernel import BackendConnectionLost, ExitInfo

DockerFault = Literal["lost", "refused", "other"]

# Exit statuses of a kernel whose host connection ended (bootstrap.py, kernel.py): the daemon
# closes a StdinOnce container's stdin when the attach stream drops, so the kernel exits with one.
EXIT_INPUT_CLOSED = frozenset({3, 70, 75})

_LOST_ERRNOS = frozenset(
    {
        errno.EPIPE,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ENOTCONN,
        errno.ESHUTDOWN,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
    }
)
_LOST_MARKERS = (
    "error while fetching server api version",
    "connection aborted",
    "connection refused",
    "connection reset",
    "broken pipe",
    "remote end closed",
    "failed to establish a new connection",
    "max retries exceeded",
)

DOCKER_LOST_FIX = (
    "Check that the Docker daemon is still running and reachable (Docker Desktop, DOCKER_HOST, an SSH tunnel or "
    "socket proxy) and was not restarted, then start the run again."
)


class DockerConnectionLost(BackendConnectionLost):
    """A sandbox's attach stream or a Docker API call lost its connection (retryable in a fresh
    sandbox); `str()` says what was seen."""


def classify(exc: BaseException) -> DockerFault:
    """ "lost": the connection to the daemon failed or dropped; "refused": the daemon answered no;
    "other": not a Docker connection matter (a bug, a timeout of ours, a user-facing error)."""
    import docker.errors
    import requests.exceptions
    import urllib3.exceptions

    if isinstance(exc, DockerConnectionLost):
        return "lost"
    if isinstance(exc, docker.errors.APIError):  # an HTTP answer from the daemon
        return "refused"
    lost_types = (
        requests.exceptions.ConnectionError,  # connect refused/reset, aborted mid-request (ProtocolError)
        requests.exceptions.ChunkedEncodingError,  # a streamed answer cut short
        requests.exceptions.ReadTimeout,  # no answer on an open connection: it is unusable
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.MaxRetryError,
        urllib3.exceptions.ReadTimeoutError,
        http.client.RemoteDisconnected,
        http.client.IncompleteRead,
        ConnectionError,  # BrokenPipe, ConnectionReset/Aborted/Refused
    )
    if isinstance(exc, lost_types):
        return "lost"
    if isinstance(exc, TimeoutError):  # socket.timeout is TimeoutError, but so are our own deadlines
        return "other"
    if isinstance(exc, OSError) and exc.errno in _LOST_ERRNOS:
        return "lost"
    if isinstance(exc, docker.errors.DockerException):  # docker-py wraps connection failures in text
        text = str(exc).lower()
        return "lost" if any(marker in text for marker in _LOST_MARKERS) else "refused"
    return "other"


def is_lost(exc: BaseException) -> bool:
    return classify(exc) == "lost"


def lost_error(attempts: int, detail: str) -> ConnectionLostError:
    """The run's end when the daemon stays out of reach: names the lost connection and what to check."""
    return ConnectionLostError(
        f"The connection to the Docker daemon was lost and a fresh sandbox could not be started "
        f"({attempts} attempt{'s' if attempts != 1 else ''} in a row; last: {detail}).",
        DOCKER_LOST_FIX,
    )


@contextmanager
def lost_raised() -> Iterator[None]:
    """A lost Docker connection as `DockerConnectionLost` (retryable), not "Docker is not running"."""
    try:
        yield
    except DockerUnavailableError as exc:
        if exc.__cause__ is not None and is_lost(exc.__cause__):
            raise DockerConnectionLost(f"a Docker API call failed: {_first_line(exc.__cause__)}") from exc
        raise


def boot_failure(why: str, state: ExitInfo, settings: SandboxSettings, image_fix: str) -> SandboxError:
    """A kernel that did not start: killed from outside, out of memory, or an image that cannot run it."""
    code = state.exit_code
    if state.oom_killed:
        return SandboxError(
            f"The sandbox ran out of memory while it started (limit {settings.sandbox_memory}).",
            "Raise RLM_MCP_SANDBOX_MEMORY (e.g. RLM_MCP_SANDBOX_MEMORY=1g).",
        )
    if isinstance(code, int) and code > 128:
        return SandboxError(
            f"The sandbox was killed by signal {code - 128} while it started.",
            "Something outside rlm-mcp stopped it (docker kill or stop, a cleanup script); check `docker events`, "
            "then start the run again.",
        )
    status = f"; exit status {code}" if isinstance(code, int) else ""
    return SandboxError(f"The sandbox kernel did not start ({why}{status}).", image_fix)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def is_refused(exc: BaseException) -> bool:
    """The daemon answered and said no (no such image, out of space, a bad request)."""
    return classify(exc) == "refused"


# Beyond a lost connection: the ways a first connection cannot be made at all.
_UNREACHABLE_MARKERS = ("no such file or directory", "cannot connect", "name or service not known", "permission denied")
_GONE_MARKERS = ("no such container", "already in progress")
# An update that raced the container's exit: Docker says "is not running", runc (through Docker)
# "container not running". Neither means the engine cannot update a running container.
_STOPPED_MARKERS = ("is not running", "container not running")


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` means the daemon cannot be reached (as opposed to a refused request)."""
    import docker.errors

    if classify(exc) == "lost" or isinstance(exc, FileNotFoundError):
        return True
    if isinstance(exc, docker.errors.DockerException) and not isinstance(exc, docker.errors.APIError):
        text = str(exc).lower()
        return any(marker in text for marker in _UNREACHABLE_MARKERS)
    return False


def is_gone(exc: BaseException) -> bool:
    """A remove that failed because the container is already gone (or being removed)."""
    text = str(exc).lower()
    return any(marker in text for marker in _GONE_MARKERS)


def stopped_while_removed(exc: BaseException) -> bool:
    """Podman's answer to a forced removal racing the container's own exit (worth one retry)."""
    text = str(exc).lower()
    return "could not be stopped" in text and "state improper" in text


def update_unsupported(exc: BaseException) -> bool:
    """Whether a failed `docker update` means the engine or runtime cannot update in place (as
    opposed to a container that is already gone or stopped, or a lost connection)."""
    import docker.errors

    if not isinstance(exc, docker.errors.APIError) or not is_refused(exc) or is_gone(exc):
        return False
    text = str(exc).lower()
    return not any(marker in text for marker in _STOPPED_MARKERS)
