"""Shared parts of the team benches (bench/scale.py team, team_perrun.py, team_idle.py): the scripted
runs, the clients, per-process CPU from /proc, the cluster and its database reads."""

from __future__ import annotations

import json
import os
import re
import secrets
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import psycopg
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures_postgres import Cluster

Embedded = tuple[Callable[..., Any], Callable[..., dict[str, str]]]
TOKEN = "bench-" + secrets.token_hex(8)
TURN = "```repl\nprint(len(context))\n```"
DONE = '```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```'
LONG = "```repl\nimport time\ntime.sleep(300)\n```"


def script(turns: int) -> dict[str, Any]:
    return {
        "max_model_len": 65536,
        "sub_default": "ok",
        "root_by_query": [
            {"match": "scale run", "replies": [TURN] * (turns - 1) + [DONE]},
            {"match": "long run", "replies": [LONG] * 50},
        ],
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(values: list[float]) -> str:
    if not values:
        return "no samples"
    return f"p50 {pct(values, 0.5) * 1000:.1f} ms, p99 {pct(values, 0.99) * 1000:.1f} ms (n={len(values)})"


@asynccontextmanager
async def client_of(url: str, *, cafile: Path | None = None) -> AsyncIterator[Client]:
    verify: Any = ssl.create_default_context(cafile=cafile) if cafile else True
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=900, verify=verify)
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        raise RuntimeError(f"{tool}: {result.content!r}")
    return dict(result.structured_content or {})


async def _ignore_progress(progress: float, total: float | None, message: str | None) -> None:
    """A progress callback that counts nothing: the call carries a progress token, so the run is followed."""


async def complete(client: Client, context_id: str, query: str, *, followed: bool = False) -> str:
    arguments = {"query": query, "context_id": context_id, "max_iterations": 50}
    result = await client.call_tool("rlm_complete", arguments, progress_callback=_ignore_progress if followed else None)
    if result.is_error:
        raise RuntimeError(f"rlm_complete: {result.content!r}")
    out = dict(result.structured_content or {})
    if out.get("answer") != "done":
        raise RuntimeError(f"unexpected result: {out!r}")
    return str(out["run_id"])


async def many_runs(client: Client, context_id: str, label: str, count: int, *, followed: bool = False) -> list[str]:
    """`followed`: each call asks for progress (a progress token), so a team front follows its run."""
    run_ids: list[str] = []

    async def one(i: int) -> None:
        run_ids.append(await complete(client, context_id, f"scale run {label} {i}", followed=followed))

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    return run_ids


class Db:
    def __init__(self, url: str) -> None:
        self.url = url

    async def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            cur = await conn.execute(sql, params)
            return list(await cur.fetchall())

    async def transactions(self) -> int:
        """Transactions committed in the cluster so far (the bench's own few included)."""
        rows = await self.rows("SELECT sum(xact_commit)::bigint AS n FROM pg_stat_database")
        return int(rows[0]["n"])

    async def claim_latencies(self, run_ids: list[str]) -> list[float]:
        """Queued -> claimed, both on the database's clock (`rlm_runs.queued_at`, `claimed_at`)."""
        rows = await self.rows(
            "SELECT extract(epoch FROM claimed_at - queued_at) AS s FROM rlm_runs "
            "WHERE run_id = ANY(%s) AND claimed_at IS NOT NULL",
            (run_ids,),
        )
        return [float(r["s"]) for r in rows]

    async def workers_of(self, run_ids: list[str]) -> dict[str, int]:
        rows = await self.rows(
            "SELECT w.pid, count(*) AS n FROM rlm_runs r JOIN rlm_workers w ON w.worker_id = r.worker_id "
            "WHERE r.run_id = ANY(%s) GROUP BY w.pid",
            (run_ids,),
        )
        return {str(r["pid"]): int(r["n"]) for r in rows}

    async def turn_starts(self, run_id: str) -> dict[int, float]:
        rows = await self.rows("SELECT line FROM rlm_run_events WHERE run_id = %s ORDER BY seq", (run_id,))
        out: dict[int, float] = {}
        for row in rows:
            event = json.loads(row["line"])
            if event.get("type") == "turn_start" and event.get("depth", 0) == 0:
                out.setdefault(int(event["iteration"]), float(event["ts"]))
        return out

    async def lm_called(self, run_ids: list[str]) -> bool:
        """Whether every run's row holds the mark of its first answered LM call (`rlm_runs.lm_called`):
        a lost worker's run is then ended as lost; one without it is queued again (by design)."""
        rows = await self.rows("SELECT count(*) AS n FROM rlm_runs WHERE run_id = ANY(%s) AND lm_called", (run_ids,))
        return int(rows[0]["n"]) == len(set(run_ids))

    async def summary(self, run_id: str) -> dict[str, Any]:
        rows = await self.rows("SELECT done, worker_id, summary FROM rlm_runs WHERE run_id = %s", (run_id,))
        row = rows[0]
        return {"done": row["done"], "worker_id": row["worker_id"], **json.loads(row["summary"])}


async def statements(db: Db, turns: int, top: int = 16) -> str:
    """The statements PostgreSQL ran during the round, by calls per turn (pg_stat_statements),
    those that differ only by how many rows they write counted as one."""
    rows = await db.rows(
        "SELECT calls, total_exec_time, query FROM pg_stat_statements WHERE query NOT LIKE %s",
        ("%pg_stat_statements%",),
    )
    grouped: dict[str, list[float]] = {}
    for r in rows:
        query = re.sub(r"\$\d+", "$", " ".join(str(r["query"]).split()))
        query = re.sub(r"(\([^()]*\))(, \([^()]*\))+", r"\1, ...", query)[:140]
        calls, took = grouped.setdefault(query, [0, 0.0])
        grouped[query] = [calls + r["calls"], took + r["total_exec_time"]]
    total = sum(c for c, _ in grouped.values())
    lines = [f"  statements per turn (pg_stat_statements; the bench's own included): {total / turns:.2f} in all"]
    for query, (calls, took) in sorted(grouped.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"    {calls / turns:6.2f}/turn {took / calls:7.3f} ms  {query}")
    return "\n".join(lines)


def started_cluster(stack: AsyncExitStack, *, statements: bool) -> Cluster:
    """A PostgreSQL cluster stopped with `stack`; with `statements`, pg_stat_statements loaded
    (a preloaded library takes effect only at start: set, then restart)."""
    cluster = Cluster()
    stack.callback(cluster.stop)
    cluster.start()
    if statements:
        cluster.sql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        cluster.stop()
        cluster.start()
        cluster.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return cluster


def team_env(runs: int, pool: int, lease: float, live_summary_interval: float | None = None) -> dict[str, str]:
    """The replicas' settings for `runs` runs at once over two workers: each runs half, with room
    for the warm pool, and the queue's waiting bounds out of the way."""
    env = {
        "RLM_MCP_MAX_RUNS": str(runs // 2),
        "RLM_MCP_MAX_SANDBOXES": str(runs // 2 + 2),
        "RLM_MCP_POOL_SIZE": str(min(pool, runs // 2)),
        "RLM_MCP_WORKER_LEASE_S": str(lease),
        "RLM_MCP_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
        "RLM_MCP_RUN_MAX_QUEUED": "1000",
        "RLM_MCP_RUN_MAX_QUEUED_PER_OWNER": "1000",
    }
    if live_summary_interval is not None:  # 0: a live summary per progress event (before coalescing)
        env["RLM_MCP_LIVE_SUMMARY_INTERVAL_S"] = str(live_summary_interval)
    return env
