"""The sandbox kernel's host watch (rlm_mcp/sandbox/guest/hostwatch.py), on plain processes: a
process whose stdin is a pipe the test holds, as the container's stdin is the host's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from rlm_mcp.testing.servers import close_pipes
from tests.paths import REPO

# argv[1] marks the process and its watch (a fork: the same command line) for the test to find.
SCRIPT = textwrap.dedent(
    """
    import os, sys
    from rlm_mcp.sandbox.guest.hostwatch import start_host_watch
    start_host_watch(0, grace_s=float(sys.argv[2]))
    print("WATCHED", flush=True)
    if sys.argv[3] == "gil":
        sum(range(10**15))  # C code holding the GIL: no thread of this process runs
    else:
        os.read(0, 1)  # the kernel's reader: the host's end closed
        os._exit(75)
    """
)


@contextlib.contextmanager
def _watched(mode: str, grace_s: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The process, its watch started; both gone when the test leaves."""
    marker = f"host-watch-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, marker, str(grace_s), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"WATCHED"
        yield proc, marker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        close_pipes(proc)
        for pid in _marked(marker):
            os.kill(pid, signal.SIGKILL)


def _marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _wait_gone(marker: str, deadline_s: float = 60.0) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not _marked(marker):
            return True
        time.sleep(0.05)
    return False


def test_a_process_holding_the_gil_is_killed_once_its_host_hangs_up() -> None:
    with _watched("gil", grace_s=0.2) as (proc, marker):
        assert proc.stdin is not None
        proc.stdin.close()  # the host is gone
        assert proc.wait(timeout=60) == -signal.SIGKILL
        assert _wait_gone(marker)  # and the watch left with it


def test_a_kernel_whose_reader_ends_it_keeps_its_exit_status_and_the_watch_leaves() -> None:
    with _watched("reader", grace_s=600) as (proc, marker):
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=60) == 75  # not the watch's SIGKILL: the reader ended it first
        assert _wait_gone(marker)  # the watch saw the kernel end through its pidfd, long before its grace
