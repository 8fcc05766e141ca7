"""The end of a traced process does not wait on a stuck trace collector (issue 41, low): one that
accepts the export and never answers held the exporter's shutdown, so exit after SIGTERM, for its
export timeout and retries (18 s measured; here the timeout is ten minutes). The process is its
own, as installing the SDK's global tracer provider cannot be undone."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.fixtures_e2e import coverage_env

CHILD = """
from rlm_mcp.observability import tracing
assert tracing.configure_from_env()
with tracing.span("rlm.turn"):
    pass
tracing.shutdown()
print("exited")
"""


@contextmanager
def stuck_collector() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback server that accepts every connection, reads, and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], held
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_stuck_collector_does_not_hold_the_process_end() -> None:
    with stuck_collector() as (port, held):
        env = {
            **coverage_env(),
            "PATH": "/usr/bin:/bin",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "600",  # the collector's answer would be awaited for 10 minutes
        }
        # The SDK alone waited 30 s for its worker (then returned with the export still hanging).
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=25)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "exited"
        assert held, "the export reached the collector"
        assert "did not take the last spans" in done.stderr
