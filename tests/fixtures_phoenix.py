"""Arize Phoenix (PyPI; source-available under the Elastic License 2.0), the LLM trace viewer many
users run, as the OTLP/HTTP receiver of the tracing tests, queried through its own client.

Like `fixtures_router`'s vllm-router it is installed once, pinned, into a virtual environment of
its own under the user's cache directory, never into the test environment or the package's
extras: it brings about 140 packages (~620 MB) whose pins must not move ours. On this project's
2-vCPU CI machine the install takes ~5 s from a warm uv cache (~40 s cold) and the server
~30 s to answer.

Its client is asked through one process that lives as long as the server: importing
`phoenix.client` loads the whole `phoenix` package (its `__init__` imports the server's session
code), about 14 s of CPU on the CI machine, which a fresh `python -c` per query paid each time
(the tracing tests poll it).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.testing.servers import close_pipes, free_port, server_process, stop_process
from tests.fixtures_uv import cached_venv

PHOENIX = "arize-phoenix==20.26.1"

# Run inside Phoenix's environment: a line `[base, project, limit]` in, one line out: the spans of
# that project as its client returns them, or the client's error.
_QUERIES = """
import json, sys
from phoenix.client import Client
clients = {}
for line in sys.stdin:
    base, project, limit = json.loads(line)
    client = clients.setdefault(base, Client(base_url=base))
    try:
        answer = {"spans": client.spans.get_spans(project_identifier=project, limit=limit)}
    except Exception as exc:
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(answer, default=str) + "\\n")
    sys.stdout.flush()
"""
_QUERY_TIMEOUT_S = 120.0


def phoenix_home() -> Path:
    """Phoenix's environment, installed on first use."""
    return cached_venv(PHOENIX, timeout_s=900)


class SpanQueries:
    """The process that asks Phoenix's client, one query at a time."""

    def __init__(self, python: Path, log: Path) -> None:
        self._lock = threading.Lock()
        self._log = log.open("w+b")
        self._proc = subprocess.Popen(
            [str(python), "-c", _QUERIES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log
        )

    def ask(self, base: str, project: str, limit: int) -> dict[str, Any]:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps([base, project, limit]).encode() + b"\n")
            self._proc.stdin.flush()
            line = self._read_line(self._proc.stdout.fileno())
        answer = json.loads(line)
        assert isinstance(answer, dict)
        return answer

    def _read_line(self, fd: int) -> bytes:
        deadline = time.monotonic() + _QUERY_TIMEOUT_S
        chunks: list[bytes] = []
        while not (chunks and chunks[-1].endswith(b"\n")):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            chunk = os.read(fd, 1 << 20) if ready else b""
            if not chunk:
                self._log.seek(0)
                reason = "no answer within the deadline" if ready == [] else "it exited"
                raise AssertionError(f"Phoenix's client failed ({reason}): {self._log.read()[-2000:]!r}")
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        try:
            stop_process(self._proc, grace_s=5)
        finally:
            close_pipes(self._proc)
            self._log.close()


@dataclass(frozen=True)
class Phoenix:
    base: str  # http://127.0.0.1:PORT: the UI, the REST API and OTLP/HTTP at /v1/traces
    queries: SpanQueries

    def spans(self, project: str = "default", limit: int = 1000) -> list[dict[str, Any]]:
        """Every span Phoenix holds for `project`, as its client returns them."""
        answer = self.queries.ask(self.base, project, limit)
        if "error" in answer:
            if "not found" in answer["error"].lower():  # no span received yet: the project does not exist
                return []
            raise AssertionError(f"Phoenix's client failed: {answer['error'][-2000:]}")
        spans = answer["spans"]
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
    # Started first: the client's imports overlap the server's start-up.
    queries = SpanQueries(home / "bin" / "python", folder / "client.log")
    try:
        argv = [str(home / "bin" / "phoenix"), "serve"]
        with server_process(argv, port=port, env=env, within_s=180, log=folder / "phoenix.log"):
            # uvicorn listens once Phoenix's start-up (migrations, the OTLP receiver) is complete
            yield Phoenix(f"http://127.0.0.1:{port}", queries)
    finally:
        queries.close()


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """One Phoenix for the session (it takes ~30 s to start): tests tell their spans apart by
    trace and run ids."""
    with phoenix_server(tmp_path_factory.mktemp("phoenix")) as receiver:
        yield receiver
