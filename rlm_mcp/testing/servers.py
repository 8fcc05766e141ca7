"""Ports and server processes for tests and benchmarks: one `free_port`, one way to start a
server in a subprocess and wait until it accepts connections."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

POLL_S = 0.05


# A folder shared by the processes of one test run (tests/parallel.py sets it up for the suite and
# its xdist workers): a file per port handed out, so that two workers never get the same one.
PORT_CLAIMS_VAR = "RLM_TEST_PORT_CLAIMS"
# Ports this process handed out: the kernel may give a released port again at once, and a server
# given a port is often not listening on it yet when the next port is asked for.
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (bound and released; IPv6 when `host` is an IPv6 address)
    and not handed out before by this process or, in a test run, by another of its processes."""
    for _ in range(1000):
        port = _kernel_port(host)
        if _claim(port):
            return port
    raise RuntimeError("no free port left that was not handed out already")


def _kernel_port(host: str) -> int:
    """The port the kernel picks for a bind to port 0, released again."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _claim(port: int) -> bool:
    if port in _handed_out:
        return False
    _handed_out.add(port)
    folder = os.environ.get(PORT_CLAIMS_VAR)
    if not folder:
        return True
    try:
        os.close(os.open(os.path.join(folder, str(port)), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def close_pipes(proc: subprocess.Popen[Any]) -> None:
    """Close the pipes of a process that has been waited for (Popen's `with` does the same): an
    open one is left to the garbage collector, with a ResourceWarning."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def server_process(
    argv: Sequence[str],
    *,
    port: int,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    host: str = "127.0.0.1",
    within_s: float = 60.0,
    quiet: bool = True,
    log: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `argv` (a server that listens on `host:port`), yield it once a TCP connection
    succeeds, stop it on exit. Fails with the server's stderr if it exits before listening.
    `quiet`: its stdout is discarded. Its stderr goes to a file (a pipe nobody reads would
    block a chatty server), read back for that message: `log` when given (the caller reads the
    server's log; its stdout goes there too, where uvicorn writes access lines), else a temporary one.
    `preexec_fn`: run in the child before it starts (e.g. to lower a resource limit it inherits)."""
    with open(log, "w+b") if log is not None else tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stderr if log is not None else subprocess.DEVNULL if quiet else None,
            stderr=stderr,
            preexec_fn=preexec_fn,
        )
        try:
            _wait_listening(proc, argv[0], host, port, within_s, stderr)
            yield proc
        finally:
            stop_process(proc)


def _wait_listening(
    proc: subprocess.Popen[bytes], name: str, host: str, port: int, within_s: float, stderr: IO[bytes]
) -> None:
    deadline = time.monotonic() + within_s
    while True:
        if proc.poll() is not None:
            stderr.seek(0)
            err = stderr.read().decode(errors="replace")
            raise AssertionError(f"{name} exited with {proc.returncode} before listening: {err[-3000:]}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not listen on {host}:{port} within {within_s:g} s") from None
            time.sleep(POLL_S)  # a process's port has no event to wait on
