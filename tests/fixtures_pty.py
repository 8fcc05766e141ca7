"""A command under a real pseudo-terminal, as a person runs it: what reaches the terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

__all__ = ["run_in_pty"]


def run_in_pty(argv: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float = 180) -> tuple[int, bytes]:
    """Run `argv` with stdout and stderr on one pty; its exit status and every byte it wrote.
    A command still writing after `timeout_s` is killed and the test fails."""
    main, child = pty.openpty()
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=child, stderr=child)
    finally:
        os.close(child)
    out = bytearray()
    deadline = time.monotonic() + timeout_s  # a deadline against hangs, not a timing assertion
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every writer closed its end
                break
            if not chunk:
                break
            out += chunk
        else:
            raise AssertionError(f"{argv[1:]} was still running after {timeout_s:g} s")
        return proc.wait(timeout=timeout_s), bytes(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
