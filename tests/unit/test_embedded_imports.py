"""The embedded default runs without the team extra: nothing on its path imports the PostgreSQL
driver (`pip install rlm-mcp` has no psycopg; team mode's modules load only when a database is
configured)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Each module an embedded server, the CLI and a one-off run import; building the embedded
# service's parts too. `psycopg` is made unimportable, as on an install without the extra.
_EMBEDDED = """
import sys
from pathlib import Path
sys.modules["psycopg"] = None
import rlm_mcp.cli, rlm_mcp.cli.serve, rlm_mcp.cli.run, rlm_mcp.cli.sessions
import rlm_mcp.server.app, rlm_mcp.server.http, rlm_mcp.assembly, rlm_mcp.doctor
from rlm_mcp.assembly import build_service
from rlm_mcp.config import Settings
build_service(Settings(data_dir=sys.argv[1]))
print(sorted(m for m in sys.modules if m.startswith(("rlm_mcp.store.pg", "rlm_mcp.service.queue"))))
"""


def test_the_embedded_path_imports_no_team_module(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _EMBEDDED, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_a_team_module_needs_the_driver_as_a_positive_control() -> None:
    code = 'import sys; sys.modules["psycopg"] = None; import rlm_mcp.store.pg.sessions'
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "psycopg" in out.stderr, out.stderr
