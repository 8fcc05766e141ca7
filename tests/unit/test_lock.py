"""uv.lock is the environment CI installs (`uv sync --locked`): it must agree with pyproject.toml,
or the next install fails. Checked offline against the lock itself (no package index)."""

from __future__ import annotations

import subprocess

from uv import find_uv_bin

from tests.paths import REPO


def test_uv_lock_agrees_with_pyproject() -> None:
    done = subprocess.run(
        [find_uv_bin(), "lock", "--check", "--offline"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (
        f"uv.lock does not match pyproject.toml:\n{done.stderr[-2000:]}\nRun `uv lock` and commit uv.lock."
    )
