"""`free_port` never hands out a port twice in one test run: not in one process (the kernel may
pick a released port again while the server it was given to is still starting), not across the
run's xdist workers (tests/parallel.py shares the folder where ports are claimed)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlm_mcp.testing import servers


def kernel_picks(monkeypatch: pytest.MonkeyPatch, *ports: int) -> None:
    """The kernel's picks for the next binds to port 0, in order."""
    picks: Iterator[int] = iter(ports)
    monkeypatch.setattr(servers, "_kernel_port", lambda host: next(picks))
    monkeypatch.setattr(servers, "_handed_out", set())


def test_a_port_the_kernel_picks_again_is_not_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(servers.PORT_CLAIMS_VAR, raising=False)
    kernel_picks(monkeypatch, 40001, 40001, 40002)
    assert [servers.free_port(), servers.free_port()] == [40001, 40002]


def test_a_port_another_process_of_the_run_claimed_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(servers.PORT_CLAIMS_VAR, str(tmp_path))
    (tmp_path / "40011").touch()  # another worker's
    kernel_picks(monkeypatch, 40011, 40012)
    assert servers.free_port() == 40012
    assert sorted(p.name for p in tmp_path.iterdir()) == ["40011", "40012"]


def test_the_suite_gives_its_processes_one_folder_of_claims() -> None:
    """tests/parallel.py sets it up before the workers start; they and the processes the tests
    start inherit it."""
    folder = os.environ.get(servers.PORT_CLAIMS_VAR)
    assert folder and Path(folder).is_dir()
    port = servers.free_port()
    assert (Path(folder) / str(port)).exists()
    child = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.environ[{servers.PORT_CLAIMS_VAR!r}])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert child.stdout.strip() == folder
