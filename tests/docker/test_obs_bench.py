"""bench/observability.py runs end to end on small sizes (a smoke: it prints its figures for
every mode; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import REPO as ROOT


def test_the_observability_bench_prints_every_mode() -> None:
    argv = [sys.executable, str(ROOT / "bench" / "observability.py"), "--repeat", "1", "--loops", "200"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for mode in ("off", "metrics", "metrics+tracing"):
        assert done.stdout.count(f" {mode} ") == 3, done.stdout  # the hooks line and both whole-run lines
    assert "per sub-call" in done.stdout
