"""The Docker client: created lazily in a worker thread, connection failures mapped to errors.

`docker.from_env()` talks to the daemon at once (it fetches the API version), so it must never
run on the event loop; and its failures arrive as several exception types whose text is
unhelpful to a person, so they are turned into `DockerUnavailableError` with the fix.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from rlm_mcp.errors import DockerUnavailableError, ImageMissingError, RlmMcpError
from rlm_mcp.sandbox.docker.faults import is_connection_error
from rlm_mcp.sandbox.docker.lean_calls import LeanCalls

log = logging.getLogger("rlm_mcp.sandbox")

DOCKER_FIX = (
    "Start Docker (Docker Desktop, or `sudo systemctl start docker`), or point DOCKER_HOST at a running Docker engine."
)
BUILD_FIX = (
    "Build it with `rlm-mcp image build` (or `rlm-mcp image build --offline` where no image "
    "registry is reachable), or set RLM_MCP_SANDBOX_IMAGE to an image that has python3."
)


def unavailable(exc: BaseException) -> DockerUnavailableError:
    return DockerUnavailableError(f"Docker is not running or cannot be reached ({short(exc)}).", DOCKER_FIX)


def short(exc: BaseException) -> str:
    """The first line of a Docker error, capped: enough to name the cause in a message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:300]


@contextmanager
def docker_errors(refused: Callable[[Exception], RlmMcpError] | None = None) -> Iterator[None]:
    """The one mapping of Docker failures to user-facing errors, for the block it wraps (as
    httpx maps transport errors): a daemon that cannot be reached becomes
    `DockerUnavailableError`; any other Docker failure becomes `refused(exc)` when given,
    else propagates unchanged. Errors that are already `RlmMcpError`s pass through."""
    import docker.errors

    try:
        yield
    except RlmMcpError:
        raise
    except Exception as exc:
        if is_connection_error(exc):
            raise unavailable(exc) from exc
        if refused is not None and isinstance(exc, docker.errors.DockerException):
            raise refused(exc) from exc
        raise


def connect_sync(timeout: float = 30.0) -> Any:
    """A connected `docker.DockerClient` (blocking: call from a worker thread)."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is a hard dependency
        raise DockerUnavailableError("The `docker` Python package is missing.", "pip install docker") from exc

    def refused(exc: Exception) -> RlmMcpError:
        return DockerUnavailableError(f"Docker refused the connection: {short(exc)}.", DOCKER_FIX)

    with docker_errors(refused):
        client = docker.from_env(timeout=int(timeout))
        if share_one_pool(client):
            skip_environment_lookups(client)
            # A sandbox's create, inspect, attach, start, update and removal skip docker-py's session layer.
            client.rlm_lean_calls = LeanCalls(client.api, ONE_POOL_KEY)
        client.ping()
        return client


# The connections kept for the daemon's socket: at most this many idle, more opened when needed.
UNIX_POOL_CONNECTIONS = 32


def share_one_pool(client: Any) -> bool:
    """Give a client on a unix socket one connection pool for every request.

    docker-py's unix adapter keeps a pool per URL (each container's URLs are new ones) in an LRU
    of 25 that closes the pool it evicts, even while another thread is sending through it: with
    many containers that request failed with urllib3's `AttributeError: 'NoneType' object has
    no attribute ...` (seen once at 32 concurrent runs), which became the run's internal error.
    Every URL on one socket is the same peer, so one pool is what the LRU would have needed.
    Other transports (TCP/TLS, SSH) are left as docker-py makes them. Whether it did (a client
    on a unix socket)."""
    from docker.transport import UnixHTTPAdapter

    api = client.api
    old: Any = getattr(api, "_custom_adapter", None)
    if type(old) is not UnixHTTPAdapter:
        return False
    adapter = _one_pool_adapter_class()(
        f"http+unix://{old.socket_path}",
        old.timeout,
        max_pool_size=max(old.max_pool_size, UNIX_POOL_CONNECTIONS),
    )
    api.mount("http+docker://", adapter)
    api._custom_adapter = adapter  # docker-py falls back to it for its own URL scheme
    old.close()
    return True


def skip_environment_lookups(client: Any) -> None:
    """A client on a unix socket: its requests skip what `requests` reads from the environment
    for every request (the proxy variables, scanned with all of os.environ, and ~/.netrc, read
    from disk), which no request to a local socket uses: 4-6% of a server's CPU per run, with
    the Docker calls of a sandbox's start and removal 31-36% of it (py-spy, 32 one-turn runs).
    Other transports keep them (a TCP engine may sit behind a proxy)."""
    client.api.trust_env = False


@functools.cache
def _one_pool_adapter_class() -> Any:
    """The adapter's class, made on first use (docker is imported only where it is used)."""
    from docker.transport import UnixHTTPAdapter

    class OnePoolUnixAdapter(UnixHTTPAdapter):  # type: ignore[misc]
        """A unix adapter whose requests all share one pool (`share_one_pool`)."""

        def get_connection(self, url: str, proxies: Any = None) -> Any:
            return super().get_connection(ONE_POOL_KEY, proxies)

    return OnePoolUnixAdapter


ONE_POOL_KEY = "http+docker://localhost"


def image_present_sync(client: Any, tag: str) -> bool:
    import docker.errors

    with docker_errors():
        try:
            client.api.inspect_image(tag)
            return True
        except docker.errors.ImageNotFound:
            return False


def image_missing(tag: str) -> ImageMissingError:
    return ImageMissingError(f"The sandbox image {tag} is not present in Docker.", BUILD_FIX)


def require_image_sync(client: Any, tag: str) -> None:
    if not image_present_sync(client, tag):
        raise image_missing(tag)


class LazyDocker:
    """One Docker client per owner, made on first use in a worker thread."""

    def __init__(self) -> None:
        self._client: Any = None
        self._lock = anyio.Lock()
        self._thread_lock = threading.Lock()

    async def get(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                self._client = await anyio.to_thread.run_sync(connect_sync)
        return self._client

    @property
    def client(self) -> Any:
        if self._client is None:
            raise RuntimeError("LazyDocker.get() has not been awaited")
        return self._client

    def close(self) -> None:
        with self._thread_lock:
            if self._client is not None:
                try:
                    self._client.close()
                except Exception:  # closing a dead connection pool is not worth a failure
                    pass
                self._client = None
