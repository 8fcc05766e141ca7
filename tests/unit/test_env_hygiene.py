"""The suite runs on its own settings, whatever the user exported (tests/conftest.py clears every
`RLM_MCP_*` variable): an exported RLM_MCP_INSTANCE_ID used to fail a sandbox-manager test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlm_mcp.config import SETTING_FIELDS, Settings
from tests.paths import REPO


def test_no_exported_setting_reaches_a_test() -> None:
    assert [name for name in os.environ if name.upper().startswith("RLM_MCP_")] == []
    assert Settings().sandbox.instance_id == SETTING_FIELDS["instance_id"].get_default(call_default_factory=True)


def test_a_pytest_run_with_settings_exported_does_not_see_them(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "RLM_MCP_INSTANCE_ID": "exported-by-the-user",
        "RLM_MCP_MAX_ITERATIONS": "1",
        "RLM_MCP_CONFIG": str(tmp_path / "absent.toml"),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", f"{__file__}::test_no_exported_setting_reaches_a_test", "--no-cov", "-n", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert (
        "cleared from the test environment: RLM_MCP_CONFIG, RLM_MCP_INSTANCE_ID, RLM_MCP_MAX_ITERATIONS" in run.stdout
    )
