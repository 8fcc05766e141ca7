"""Kept sessions in team mode: what a follow-up costs when the session's state is in PostgreSQL and
the snapshot after each run is taken in the background, with a scripted LM that takes a fixed
time per call.

    .venv/bin/python bench/team_sessions.py --database-url postgresql://... [--mib 20] [--delay 0.5] [--repeat 3]

One in-process replica (front and worker, `RLM_MCP_ROLE=both`) on the given database (migrated at
start; use an empty one). Each run's first turn is the expensive part: an index of every word of
a `--mib` MiB context. Reported (medians of `--repeat`):

- fresh run: builds the index and answers (2 root calls), no session;
- session's first run: the same work with `keep_session` (its result does not wait for the
  snapshot, which starts once the result is out);
- follow-up sent at once: asked the moment the first run's result arrived, so it waits for the
  background snapshot of the index, then runs in the live REPL (1 root call);
- warm follow-up: asked once the snapshot after the previous run is stored (the usual case: an
  agent reads an answer before it asks again);
- snapshot stored after the result: from the warm follow-up's result to its snapshot in the
  database (polled every 20 ms);
- restore follow-up: after the worker let the sandbox go (as when it is lost): a fresh sandbox,
  the context reloaded, the snapshot read from the database and loaded inside the sandbox.

Never fails on a timing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import docker
import psycopg

from rlm_mcp.assembly import build_service
from rlm_mcp.config import Settings
from rlm_mcp.owners import Owner
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing import scripted_lm_process

BUILD = "```repl\nindex = {}\nfor i, w in enumerate(context.split()):\n    index.setdefault(w, []).append(i)\nprint(len(index))\n```"
ANSWER = '```repl\nanswer["content"] = str(len(index["w7"]))\nanswer["ready"] = True\n```'
OWNER = Owner("bench")


async def quiet(progress: float, total: float | None, message: str) -> None:
    return None


async def wait_for(condition_sql: str, url: str, session_id: str, within_s: float = 300.0) -> None:
    """Until `condition_sql` (a boolean over rlm_sessions s) holds for the session."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with anyio.fail_after(within_s):
            while True:
                cur = await conn.execute(
                    f"SELECT {condition_sql} FROM rlm_sessions s WHERE s.session_id = %s", (session_id,)
                )
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return
                await anyio.sleep(0.02)


async def let_go(url: str, session_id: str) -> None:
    """The worker's next sweep lets the sandbox go (as if the session had moved to another worker)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("UPDATE rlm_sessions SET worker_id = NULL WHERE session_id = %s", (session_id,))


def containers(instance: str) -> int:
    client = docker.from_env()
    try:
        return len(client.api.containers(all=True, filters={"label": f"rlm-mcp.owner={instance}"}))
    finally:
        client.close()


async def bench(url: str, mib: int, delay: float, repeat: int) -> None:
    words = " ".join(f"w{i % 5000}" for i in range(20000)) + " "
    text = (words * (mib * 2**20 // len(words) + 1))[: mib * 2**20]
    script = {
        "root_by_query": [
            {"match": "BUILD-THEN-ANSWER", "replies": [BUILD, ANSWER]},
            {"match": "ANSWER-FROM-INDEX", "replies": [ANSWER]},
        ],
        "delay_s": {"root": delay, "sub": delay},
        "max_model_len": 65536,
    }
    instance = f"bench-team-sessions-{int(time.time())}"
    results: dict[str, list[float]] = {
        k: [] for k in ("fresh", "opened", "at_once", "stored_after", "warm", "restored", "snapshot_mib")
    }
    with tempfile.TemporaryDirectory() as tmp, scripted_lm_process(script) as lm:
        settings = Settings(
            base_url=lm,
            data_dir=Path(tmp) / "data",
            pool_size=0,
            instance_id=instance,
            sandbox_memory="2g",
            database_url=url,
            role="both",
            queue_poll_s=0.2,
        )
        async with build_service(settings, mode="http") as service:
            caller = Caller(service, OWNER)
            cid = (await caller.load_context(text=text)).context_id
            await caller.complete("BUILD-THEN-ANSWER warm-up", cid, RunOverrides(), quiet)
            for _ in range(repeat):
                t = time.perf_counter()
                r = await caller.complete("BUILD-THEN-ANSWER", cid, RunOverrides(), quiet)
                results["fresh"].append(time.perf_counter() - t)
                assert r.status == "completed", r

                t = time.perf_counter()
                r, sid = await caller.complete_in_session(
                    "BUILD-THEN-ANSWER", cid, RunOverrides(), quiet, keep_session=True
                )
                answered = time.perf_counter()
                results["opened"].append(answered - t)
                assert r.status == "completed" and sid is not None, r
                r, _ = await caller.complete_in_session(
                    "ANSWER-FROM-INDEX", None, RunOverrides(), quiet, session_id=sid
                )
                results["at_once"].append(time.perf_counter() - answered)
                assert r.status == "completed", r

                await wait_for("s.snapshot_gen = s.generation", url, sid)
                t = time.perf_counter()
                r, _ = await caller.complete_in_session(
                    "ANSWER-FROM-INDEX", None, RunOverrides(), quiet, session_id=sid
                )
                answered = time.perf_counter()
                results["warm"].append(answered - t)
                assert r.status == "completed", r
                await wait_for("s.snapshot_gen = s.generation", url, sid)
                results["stored_after"].append(time.perf_counter() - answered)
                shown = await caller.session(sid)
                results["snapshot_mib"].append(float(shown["snapshot_bytes"] or 0) / 2**20)  # type: ignore[arg-type]
                await let_go(url, sid)
                with anyio.fail_after(60):
                    while await anyio.to_thread.run_sync(containers, instance):
                        await anyio.sleep(0.1)
                t = time.perf_counter()
                r, _ = await caller.complete_in_session(
                    "ANSWER-FROM-INDEX", None, RunOverrides(), quiet, session_id=sid
                )
                results["restored"].append(time.perf_counter() - t)
                assert r.status == "completed", r
                await wait_for("s.snapshot_gen = s.generation", url, sid)
                await caller.close_session(sid)

    def row(name: str, walls: list[float]) -> str:
        return f"{name:<40} median {statistics.median(walls):7.3f} s  [{min(walls):.3f}, {max(walls):.3f}]"

    print(f"team-mode kept sessions, {mib} MiB context, LM delay {delay * 1000:.0f} ms per call, {repeat} repeats")
    print(f"machine: {platform.node()} {platform.machine()}, {platform.python_version()}")
    print(row("fresh run (build index + answer)", results["fresh"]))
    print(row("session's first run (same work)", results["opened"]))
    print(row("follow-up sent at once (waits snapshot)", results["at_once"]))
    print(row("snapshot stored, after the result", results["stored_after"]))
    print(row("warm follow-up (snapshot already stored)", results["warm"]))
    print(row("restore follow-up (snapshot from the db)", results["restored"]))
    print(f"snapshot size (median): {statistics.median(results['snapshot_mib']):.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", required=True, help="an empty PostgreSQL database (migrated at start)")
    parser.add_argument("--mib", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    anyio.run(bench, args.database_url, args.mib, args.delay, args.repeat)


if __name__ == "__main__":
    main()
