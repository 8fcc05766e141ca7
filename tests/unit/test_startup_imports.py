"""What a process loads before it serves: every `uvx rlm-mcp`, replica and CLI command pays for
its imports on each start, so the heavy libraries that only some paths use load on those paths.

- the LM layer's aiohttp loads with its first connection pool (lm/http.py `HttpPool`);
- httpx (with, where installed, its command line's click, rich and pygments) loads with the first
  URL load (service/loaders `fetch_url`) or webhook delivery (service/webhooks/deliverer.py);
- the assembly (engine, LM client, sandboxes, services) loads only for the commands that build
  parts: the argument parser (`--help`, and every command before it runs) does not import it, nor
  the engine (service/limits.py imports `RunLimits` when it makes one).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

# Loaded later than start-up, by the paths named above.
_LATE = ("aiohttp", "httpx", "rich", "pygments")


def _loaded(code: str, names: tuple[str, ...], data_dir: Path) -> list[str]:
    """Which of `names` are in sys.modules after `code` ran in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(sorted(n for n in {names!r} if n in sys.modules))"
    env = {**os.environ, "RLM_MCP_DATA_DIR": str(data_dir)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return list(ast.literal_eval(out.stdout.strip().splitlines()[-1]))


def test_the_parser_loads_no_part_of_the_service(tmp_path: Path) -> None:
    code = "from rlm_mcp.cli import build_parser\nbuild_parser()"
    services = ("rlm_mcp.assembly", "rlm_mcp.engine", "rlm_mcp.lm", "rlm_mcp.sandbox", "rlm_mcp.store")
    heavy = (*_LATE, "mcp", "docker", "psycopg", "prometheus_client", *services)
    assert _loaded(code, heavy, tmp_path) == []


def test_a_command_that_builds_parts_still_loads_the_assembly_as_a_positive_control(tmp_path: Path) -> None:
    code = "from rlm_mcp.cli import main\nassert main(['runs', 'list']) == 0"
    assert _loaded(code, ("rlm_mcp.assembly",), tmp_path) == ["rlm_mcp.assembly"]


def test_the_server_and_its_service_start_without_the_http_clients(tmp_path: Path) -> None:
    # build_service makes every part of an embedded server (not entered: no sandbox, no LM call).
    code = (
        "import rlm_mcp.cli.serve, rlm_mcp.server.app, rlm_mcp.server.http\n"
        "from rlm_mcp.assembly import build_service\n"
        "from rlm_mcp.config import Settings\n"
        "build_service(Settings())"
    )
    assert _loaded(code, _LATE, tmp_path) == []


def test_loading_a_url_still_loads_httpx_as_a_positive_control(tmp_path: Path) -> None:
    # An ftp:// URL is refused after the loader's module (and httpx) loaded, before any network.
    code = (
        "import asyncio\n"
        "from rlm_mcp.config import Settings\n"
        "from rlm_mcp.errors import BadArgumentError\n"
        "from rlm_mcp.service.loaders import fetch_url\n"
        "s = Settings()\n"
        "try:\n"
        "    asyncio.run(fetch_url('ftp://example.org/a', loads=s.loads, store=s.store, allow_private=False))\n"
        "except BadArgumentError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('not refused')"
    )
    assert _loaded(code, ("httpx",), tmp_path) == ["httpx"]
