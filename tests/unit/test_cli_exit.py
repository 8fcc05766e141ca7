"""How the `rlm-mcp` process ends (`cli.run`): with `main`'s status and its output complete, also
after the object-storage client was loaded (its runtime's threads could abort a normal exit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_e2e import cli_env

# `main` refuses an unknown run id with status 1 and one line on stderr; stdout gets the help's
# first line beforehand, so both streams must reach the reader.
SCRIPT = """
import sys
if sys.argv[1] == "obstore":
    import obstore  # noqa: F401 - what a bucket check or a team store loads
print("before the command", flush=False)
sys.argv = ["rlm-mcp", "runs", "show", "run_nope"]
from rlm_mcp.cli import run
run()
"""


@pytest.mark.parametrize("loaded", ["obstore", "nothing"])
def test_the_process_ends_with_mains_status_and_all_its_output(tmp_path: Path, loaded: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, loaded], env=cli_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == "before the command\n"
    assert "rlm-mcp: " in done.stderr and "run_nope" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
