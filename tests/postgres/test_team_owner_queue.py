"""Team mode's per-owner waiting bound holds across replicas, through the MCP surface: two real
front processes (`rlm-mcp serve --role front`, no worker, so nothing is claimed and every accepted
run stays queued; no sandbox, so no Docker) on one PostgreSQL database take 32 concurrent
`rlm_start` calls from one token. The bound is counted on the database under one lock, so exactly
RLM_MCP_RUN_MAX_QUEUED_PER_OWNER of them are accepted, whichever front each call reached, and
every other call is refused with the tool error that names the setting."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import anyio
import psycopg
import pytest
from mcp import Client

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_surface import ANSWER_NOW, call
from tests.fixtures_team import SHORT_LEASES, replica_client, team_replica

pytestmark = pytest.mark.anyio

TOKEN = "owner-queue-token"
BOUND = 20
STARTS = 32


def queued_runs(db: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute("SELECT count(*) FROM rlm_runs WHERE state = 'queued'").fetchone()
    assert found is not None
    return int(found[0])


async def test_one_owners_waiting_bound_holds_across_two_fronts(tmp_path: Path, pg_url: str) -> None:
    env = {
        **SHORT_LEASES,
        "RLM_MCP_RUN_MAX_QUEUED_PER_OWNER": str(BOUND),
        "RLM_MCP_RUN_MAX_QUEUED": "64",  # the overall bound is not the one reached
        "RLM_MCP_RUN_QUEUE_TIMEOUT_S": "3600",  # no queued run ends (and frees a place) mid-test
    }
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm, ExitStack() as stack:
        fronts = [
            stack.enter_context(
                team_replica(
                    tmp_path / name, role="front", database_url=pg_url, lm_url=lm.base_url, tokens=[TOKEN], env=env
                )
            )
            for name in ("front-a", "front-b")
        ]
        async with replica_client(fronts[0], TOKEN) as on_a, replica_client(fronts[1], TOKEN) as on_b:
            cid = (await call(on_a, "rlm_load_context", text="waiting haystack " * 100))["context_id"]
            accepted: list[str] = []
            refused: list[str] = []
            accepted_by: dict[int, int] = {0: 0, 1: 0}  # accepted runs per front

            async def start(client: Client, i: int) -> None:
                result = await client.call_tool("rlm_start", {"query": f"run {i}", "context_id": cid})
                if result.is_error:
                    refused.append(" ".join(getattr(c, "text", "") for c in result.content))
                else:
                    assert result.structured_content is not None
                    accepted.append(result.structured_content["run_id"])
                    accepted_by[i % 2] += 1

            with anyio.fail_after(300):  # generous: a loaded 2-core machine
                async with anyio.create_task_group() as tg:
                    for i in range(STARTS):  # alternately through each front, all at once
                        tg.start_soon(start, on_a if i % 2 == 0 else on_b, i)

            assert len(accepted) == BOUND and len(set(accepted)) == BOUND, (accepted, refused)
            assert len(refused) == STARTS - BOUND, refused
            assert all(f"RLM_MCP_RUN_MAX_QUEUED_PER_OWNER={BOUND}" in text for text in refused), refused
            assert queued_runs(pg_url) == BOUND
            # 16 calls reached each front, so each accepted at least 4: the bound is the owner's
            # across both, not each front's own.
            assert min(accepted_by.values()) >= BOUND - STARTS // 2, accepted_by
            # Each accepted run is queued (no worker claims it) and readable through either front.
            for run_id in accepted:
                assert (await call(on_b, "rlm_status", run_id=run_id))["status"] == "queued"
            for i, run_id in enumerate(accepted):  # clean up: nothing left waiting
                await call(on_a if i % 2 else on_b, "rlm_cancel", run_id=run_id)
            assert queued_runs(pg_url) == 0
