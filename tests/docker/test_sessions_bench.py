"""The kept-session benchmark runs end to end on a small size (a smoke: it prints its figures; no
timing is ever asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.paths import REPO

BENCH = REPO / "bench"

pytestmark = pytest.mark.docker


def test_sessions_bench_prints_each_scenario() -> None:
    argv = [sys.executable, str(BENCH / "sessions.py"), "--mib", "1", "--delay", "0.01", "--repeat", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    for row in ("fresh run (build index + answer)", "warm follow-up (index reused)", "idle session's sandbox"):
        assert row in done.stdout
