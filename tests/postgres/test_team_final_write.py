"""A team worker's final write (`service/queue/final_writes.py`) is retried only while the database
is out of reach: a record the database refuses for what it holds (a lone UTF-16 surrogate in the
answer made the worker retry for ten minutes, the run `running` with its slot held) ends the run
`error` at once, saying why (issue 41)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.engine import RunProgress
from rlm_mcp.ports.runs import RunResult
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue import final_writes
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.runs import PgRunStore
from rlm_mcp.usage import Usage
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

RUN = "run_refused_final0001"
LIMITS = {"max_iterations": 5, "max_depth": 1, "timeout_s": 60.0, "token_budget": None, "max_errors": 3}


async def test_a_final_record_the_database_refuses_ends_the_run_error_at_once(tmp_path: Path, pg_url: str) -> None:
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "data")
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database) and isinstance(stores.runs, PgRunStore)
        queue = PgRunQueue(queue_rules(settings.queue), db)
        worker = await queue.register_worker("owner-w", 2)
        stored = {"query": "q", "context_ids": [], "owner": "local", "limits": LIMITS, "status": "queued"}
        await queue.enqueue(run_record(RUN, stored), 1)
        row = await queue.claim(worker, 4, 4)
        assert row is not None and row.run_id == RUN

        request = row.summary.request
        run = ActiveRun(run_id=RUN, request=request, progress=RunProgress(run_id=RUN, max_iterations=5))
        run.progress.status, run.progress.iterations = "completed", 2
        run.result = RunResult(
            status="completed", answer="half \ud83d an emoji", reason=None, run_id=RUN, iterations=2,
            usage=Usage(), duration_s=1.5, sub_calls=0,
        )  # fmt: skip
        run_log = QueueRunLog(await stores.runs.reopen(RUN, attempt=row.attempt))
        # The bug retried for FINAL_WRITE_S (600 s); a refusal is not retried at all.
        with anyio.fail_after(60):
            await final_writes.ensure_final(queue, run, run_log, row.attempt)

        ended = await queue.read(RUN)
    assert ended is not None and ended.done
    result = ended.summary.to_stored()["result"]
    assert (result["status"], result["answer"], result["duration_s"], result["iterations"]) == ("error", None, 1.5, 2)
    assert "The store refused the run's final record (UnicodeEncodeError: " in result["reason"]
    assert ended.summary.to_stored()["notice_facts"]["kind"] == "record_refused"
    assert ended.summary.to_stored()["notice"] == result["reason"]
