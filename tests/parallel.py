"""The suite in worker processes (pytest-xdist): how many, and what the workers share.

The test command (`addopts` in pyproject.toml: `-n auto --dist loadfile`) runs the suite in
worker processes, whole modules at a time (a module's fixtures and its tests stay together). Most
of the suite's time is spent waiting on Docker, PostgreSQL and the servers the tests start, so two
workers on two cores finish well before one. `-n 0` runs it in this process (one file, a debugger).

What the workers share is built under a file lock (`shared_lock`): the cached venvs and
JavaScript tools in the user's cache, the sandbox image. Ports are not shared: `free_port`
(rlm_mcp/testing/servers.py) never hands out a port twice in one run of the suite, across workers
too, through the folder of claims set up here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

from rlm_mcp.testing.servers import PORT_CLAIMS_VAR

__all__ = ["Timeout"]  # what `shared_lock(...).acquire()` raises when its time is up

# Each worker starts PostgreSQL clusters, S3 servers, rlm-mcp servers and sandboxes of its own: a
# big machine's cores are not worth a worker each (memory, Docker's own pace), so at most this many.
MAX_WORKERS = 4
# xdist's own override of `-n auto`; our rule below applies only when it is not set.
WORKERS_VAR = "PYTEST_XDIST_AUTO_NUM_WORKERS"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1


def worker_count() -> int | None:
    """`-n auto`: one worker per usable core up to MAX_WORKERS; 0 (the suite runs in this
    process) on one core. None when WORKERS_VAR is set: xdist reads it itself."""
    if os.environ.get(WORKERS_VAR):
        return None
    cpus = usable_cpus()
    return 0 if cpus < 2 else min(cpus, MAX_WORKERS)


def shared_lock(path: Path, timeout_s: float = 1800) -> FileLock:
    """A lock held across processes (xdist's workers, and other test runs on this machine) while
    building what `path` names; the lock file sits beside it. Waits up to `timeout_s`: the longest
    build under it (the sandbox image, a venv) takes minutes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path.with_name(path.name + ".lock")), timeout=timeout_s)


def image_lock() -> FileLock:
    """Held while checking for and building the sandbox image: one build per machine at a time."""
    return shared_lock(Path(tempfile.gettempdir()) / "rlm-mcp-tests-sandbox-image")


def start_port_claims() -> Path | None:
    """The folder where `free_port` claims the ports it hands out, for this run of the suite and
    its workers (they inherit the environment). None when an enclosing run made one already."""
    if os.environ.get(PORT_CLAIMS_VAR):
        return None
    folder = Path(tempfile.mkdtemp(prefix="rlm-mcp-test-ports-"))
    os.environ[PORT_CLAIMS_VAR] = str(folder)
    return folder


def end_port_claims(folder: Path | None) -> None:
    if folder is not None:
        os.environ.pop(PORT_CLAIMS_VAR, None)
        shutil.rmtree(folder, ignore_errors=True)
