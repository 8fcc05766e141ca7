"""Arize Phoenix (PyPI; source-available under the Elastic License 2.0), the LLM trace viewer many
users run, as the OTLP/HTTP receiver of the tracing tests, queried through its own client.

Like `fixtures_router`'s vllm-router it is installed once, pinned, into a virtual environment of
its own under the user's cache directory, never into the test environment or the package's
extras: it brings about 140 packages (~620 MB) whose pins must not move ours. On this project's
2-vCPU CI machine the install takes ~5 s from a warm uv cache (~40 s cold) and the server
~30 s to answer.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.testing.servers import free_port, server_process
from tests.fixtures_uv import cached_venv

PHOENIX = "arize-phoenix==20.26.1"

# Run inside Phoenix's environment: its client reads the spans of one project, as JSON.
_QUERY = """
import json, sys
from phoenix.client import Client
client = Client(base_url=sys.argv[1])
spans = client.spans.get_spans(project_identifier=sys.argv[2], limit=int(sys.argv[3]))
print(json.dumps(spans, default=str))
"""


def phoenix_home() -> Path:
    """Phoenix's environment, installed on first use."""
    return cached_venv(PHOENIX, timeout_s=900)


@dataclass(frozen=True)
class Phoenix:
    base: str  # http://127.0.0.1:PORT: the UI, the REST API and OTLP/HTTP at /v1/traces
    python: Path

    def spans(self, project: str = "default", limit: int = 1000) -> list[dict[str, Any]]:
        """Every span Phoenix holds for `project`, as its client returns them."""
        argv = [str(self.python), "-c", _QUERY, self.base, project, str(limit)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            if "not found" in proc.stderr.lower():  # no span received yet: the project does not exist
                return []
            raise AssertionError(f"Phoenix's client failed: {proc.stderr[-2000:]}")
        spans = json.loads(proc.stdout)
        assert isinstance(spans, list)
        return spans


@contextmanager
def phoenix_server(folder: Path) -> Iterator[Phoenix]:
    home = phoenix_home()
    port = free_port()
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", ""),
        "PHOENIX_WORKING_DIR": str(folder),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),  # its default (4317) may be taken by a real collector
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    folder.mkdir(parents=True, exist_ok=True)
    argv = [str(home / "bin" / "phoenix"), "serve"]
    with server_process(argv, port=port, env=env, within_s=180, log=folder / "phoenix.log"):
        # uvicorn listens once Phoenix's start-up (migrations, the OTLP receiver) is complete
        yield Phoenix(f"http://127.0.0.1:{port}", home / "bin" / "python")


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """One Phoenix for the session (it takes ~30 s to start): tests tell their spans apart by
    trace and run ids."""
    with phoenix_server(tmp_path_factory.mktemp("phoenix")) as receiver:
        yield receiver
