"""How many xdist workers the test command starts (tests/parallel.py), and its shared locks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import parallel


@pytest.mark.parametrize(("cpus", "workers"), [(1, 0), (2, 2), (3, 3), (4, 4), (64, parallel.MAX_WORKERS)])
def test_one_worker_per_core_up_to_the_cap_and_none_on_one_core(
    monkeypatch: pytest.MonkeyPatch, cpus: int, workers: int
) -> None:
    monkeypatch.delenv(parallel.WORKERS_VAR, raising=False)
    monkeypatch.setattr(parallel, "usable_cpus", lambda: cpus)
    assert parallel.worker_count() == workers


def test_xdists_own_variable_overrides_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.WORKERS_VAR, "3")
    assert parallel.worker_count() is None  # xdist reads the variable itself


# Another process holding the lock until its stdin closes.
HOLDER = (
    "import sys\n"
    "from filelock import FileLock\n"
    "with FileLock(sys.argv[1]):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


def test_the_shared_lock_is_held_across_processes(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "venv.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as other:
        assert other.stdout is not None and other.stdin is not None
        try:
            assert other.stdout.readline() == "held\n"
            with pytest.raises(parallel.Timeout):
                parallel.shared_lock(tmp_path / "venv", timeout_s=0.2).acquire()
        finally:
            other.stdin.close()
            other.wait(60)
    with parallel.shared_lock(tmp_path / "venv", timeout_s=10):
        pass
