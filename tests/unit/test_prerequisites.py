"""The test command checks what the selected tests need before running any (tests/prerequisites.py)
and lists everything missing in one message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.paths import REPO


def test_missing_node_and_docker_are_listed_in_one_message_before_any_test() -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/nonexistent",  # no node, npm, npx
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
    }
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/clients/test_claude_code_cli.py",
            "tests/e2e/test_eval_e2e.py",
            "--no-cov",
            # One xdist worker, as the test command runs (tests/parallel.py): the controller
            # checks, from the worker's collection; a worker that exited would be a crash report.
            "-n",
            "1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "The selected tests need what this machine lacks:" in out
    assert "Node.js with npm and npx" in out and "a running Docker daemon" in out
    assert " passed" not in out and " failed" not in out
