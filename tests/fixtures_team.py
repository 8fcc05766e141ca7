"""One team-mode replica in a subprocess (`rlm-mcp serve --transport http --role ROLE` on a
PostgreSQL database), the one starter the team tests share: tests/e2e/test_team_queue.py starts them
one by one, tests/fixtures_haproxy.py puts several behind HAProxy.

Each replica has its own folder (data dir, allowed root) and log (`server.log`: stderr and
uvicorn's access lines, which say which replica answered), its own sandbox owner label, and is
stopped (SIGTERM, then SIGKILL) on exit unless the test killed it first.

The queue tests' shorthands (`replica`, `client`: one token, short leases) and their looks at a
run's row in the database (`row`, `in_cell`, `cell_started`) are here too.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import psycopg
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rlm_mcp.testing.servers import free_port, server_process
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env, new_instance_id

# Leases short enough for quick tests, long enough that a loaded 2-core CI machine does not miss
# one; a cell timeout no stuck test cell reaches.
SHORT_LEASES = {
    "RLM_MCP_WORKER_LEASE_S": "6",
    "RLM_MCP_QUEUE_POLL_S": "0.5",
    "RLM_MCP_CELL_TIMEOUT_S": "300",
}
# The token of the replicas `replica` starts (tests/e2e/test_team_queue.py, test_team_fencing.py).
QUEUE_TOKEN = "queue-team-token"
_ACCESS = re.compile(r'"(GET|POST|DELETE) /mcp HTTP/[0-9.]+"')


@dataclass(frozen=True)
class Replica:
    name: str
    base: str  # http://127.0.0.1:PORT, the replica itself (no balancer)
    log: Path
    role: str  # both, front or worker
    owner: str  # its sandboxes' owner label (RLM_MCP_INSTANCE_ID)
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL: no clean-up of its own (the exit of `team_replica` then only reaps it)."""
        self.proc.kill()
        self.proc.wait()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def mcp_requests(self) -> int:
        """Requests to /mcp this replica has answered (its access log)."""
        return len(_ACCESS.findall(self.text()))

    def created_session(self, session_id: str) -> bool:
        return f"session ID: {session_id}" in self.text()


@contextmanager
def team_replica(
    folder: Path,
    *,
    role: str,
    database_url: str,
    lm_url: str,
    tokens: Sequence[str],
    env: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Iterator[Replica]:
    """A replica with its data under `folder` (created), named `name` (default: the folder's
    name); `env` adds or overrides settings (RLM_MCP_*)."""
    folder.mkdir()
    port = free_port()
    owner = new_instance_id()
    settings = {
        "RLM_MCP_DATABASE_URL": database_url,
        "RLM_MCP_BASE_URL": lm_url,
        "RLM_MCP_AUTH_TOKENS": ",".join(tokens),
        "RLM_MCP_SANDBOX_MEMORY": "512m",
        "RLM_MCP_LOG_LEVEL": "INFO",  # access lines: which replica answered
        "RLM_MCP_INSTANCE_ID": owner,
        **(env or {}),  # the caller's settings win
    }
    log = folder / "server.log"
    argv = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port), "--role", role]
    with server_process(argv, port=port, env=cli_env(folder, **settings), within_s=120, log=log) as proc:
        yield Replica(name or folder.name, f"http://127.0.0.1:{port}", log, role, owner, proc)


@asynccontextmanager
async def replica_client(replica: Replica, token: str) -> AsyncIterator[Client]:
    """An MCP client of one replica itself (past any balancer)."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=180)
    async with http, Client(streamable_http_client(f"{replica.base}/mcp", http_client=http)) as client:
        yield client


def replica(
    tmp_path: Path, name: str, db: str, lm_url: str, role: str, **extra: str
) -> AbstractContextManager[Replica]:
    """A replica (`team_replica`) in `tmp_path / name`, with the queue tests' token and short leases."""
    return team_replica(
        tmp_path / name, role=role, database_url=db, lm_url=lm_url, tokens=[QUEUE_TOKEN], env={**SHORT_LEASES, **extra}
    )


def client(r: Replica) -> AbstractAsyncContextManager[Client]:
    """An MCP client of `r` (a `replica`) with the queue tests' token."""
    return replica_client(r, QUEUE_TOKEN)


def row(db: str, run_id: str) -> dict[str, Any]:
    """A run's queue row (summary decoded) and the worker that holds it, read from the database."""
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute(
            "SELECT r.summary, r.done, r.worker_id, r.requeues, w.pid, w.owner_id, r.followed FROM rlm_runs r "
            "LEFT JOIN rlm_workers w ON w.worker_id = r.worker_id WHERE r.run_id = %s",
            (run_id,),
        ).fetchone()
    assert found is not None
    summary, done, worker_id, requeues, pid, owner, followed = found
    return {
        "summary": json.loads(summary),
        "done": done,
        "worker_id": worker_id,
        "requeues": requeues,
        "pid": pid,
        "owner": owner,
        "followed": followed,
    }


def in_cell(db: str, run_id: str) -> bool:
    """The run's published summary says a cell is running."""
    return row(db, run_id)["summary"].get("phase") == "cell"


def cell_started(db: str, run_id: str) -> bool:
    """The run's log has its first cell: the LM answered (the published summary may lag)."""
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM rlm_run_events WHERE run_id = %s AND line::jsonb ->> 'type' = 'cell_start'", (run_id,)
        ).fetchone()
    return found is not None
