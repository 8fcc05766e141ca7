"""Debian's Prometheus (`apt-get install prometheus`, as .ci/run does) scraping servers on
loopback, and `promtool`: the receiver and the checker an operator runs.

`prometheus_server` starts one with its own storage under a test folder, scraping the given
targets every second (with a bearer token when given), and answers instant queries through
its HTTP API (`query`).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlm_mcp.testing.servers import free_port, server_process


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's prometheus package (apt-get install -y prometheus)"
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=120)


@dataclass(frozen=True)
class Prometheus:
    base: str

    def query(self, expr: str) -> list[dict[str, object]]:
        """The instant vector `expr` evaluates to now (raises on a query error)."""
        response = httpx.get(f"{self.base}/api/v1/query", params={"query": expr}, timeout=30)
        body = response.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        data = body["data"]
        assert isinstance(data, dict)
        result = data["result"]
        assert isinstance(result, list)
        return result

    def value(self, expr: str) -> float | None:
        """The single value of `expr`, None when it has no sample (yet)."""
        result = self.query(expr)
        if not result:
            return None
        sample = result[0]["value"]
        assert isinstance(sample, list)
        return float(sample[1])

    def targets_up(self) -> bool:
        return self.value("min(up)") == 1.0


@contextmanager
def prometheus_server(folder: Path, targets: Sequence[str], *, token: str | None = None) -> Iterator[Prometheus]:
    """Prometheus scraping `targets` (host:port) at /metrics every second."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: install Debian's prometheus package (apt-get install -y prometheus)"
    folder.mkdir(parents=True, exist_ok=True)
    auth = ""
    if token is not None:
        (folder / "token").write_text(token)
        auth = f"    authorization:\n      credentials_file: {folder / 'token'}\n"
    listed = ", ".join(f"'{t}'" for t in targets)
    config = (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: rlm-mcp\n    metrics_path: /metrics\n"
        f"{auth}    static_configs:\n      - targets: [{listed}]\n"
    )
    (folder / "prometheus.yml").write_text(config)
    port = free_port()
    argv = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    with server_process(argv, port=port, log=folder / "prometheus.log"):
        yield Prometheus(f"http://127.0.0.1:{port}")
