"""Issue 20 item 11: the run queue is bounded, overall and per owner, with an immediate busy
error (1,100 queued runs used to hold 1,100 descriptors), and a queued run's log is opened only
when it starts. Real sandboxes, the scripted LM."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from rlm_mcp.server.app import build_server
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_surface import STUCK, call, call_error, make_settings

pytestmark = pytest.mark.anyio


async def test_a_full_queue_refuses_at_once(tmp_path: Path) -> None:
    with ScriptedLM(Script(root=[STUCK])) as lm:
        settings = make_settings(
            tmp_path, lm.base_url, max_runs=1, run_max_queued=1, run_queue_timeout_s=600, cell_timeout_s=600
        )
        async with Client(build_server(settings)) as client:
            ctx = (await call(client, "rlm_load_context", text="c"))["context_id"]
            first = await call(client, "rlm_start", query="q1", context_id=ctx)
            second = await call(client, "rlm_start", query="q2", context_id=ctx)  # waits for a slot
            runs = Path(settings.store.data_dir) / "runs"
            await wait_until(lambda: (runs / first["run_id"] / "events.jsonl").exists(), what="the first run's log")
            # The waiting run has its record (rlm_status answers) but no log file open yet.
            assert (await call(client, "rlm_status", run_id=second["run_id"]))["status"] == "queued"
            assert not (runs / second["run_id"] / "events.jsonl").exists()
            message = await call_error(client, "rlm_start", query="q3", context_id=ctx)
            assert "RLM_MCP_RUN_MAX_QUEUED" in message and "1 run" in message
            for run in (second, first):
                await call(client, "rlm_cancel", run_id=run["run_id"])
            # Room again.
            third = await call(client, "rlm_start", query="q4", context_id=ctx)
            await call(client, "rlm_cancel", run_id=third["run_id"])
