"""A plain call names every turn of its run once in its progress notifications, with values
that only grow (docs/long-runs.md), however fast the run: also the turns of a run that ended
before the waiter first woke, and a run's last turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.engine.types import RunProgress
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.run_values import RunResult
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.usage import Usage
from tests.fixtures_engine import make_limits, make_settings

pytestmark = pytest.mark.anyio


class _FinishedAlready(Caller):
    """A caller whose runs have ended (after `turns` turns) before `start_run` returns: as a
    fast run on a fast LM does while its start waits for its record."""

    def __init__(self, turns: int, tmp_path: Path) -> None:
        super().__init__(service=None, owner=LOCAL_OWNER)  # type: ignore[arg-type]  # not reached: the run is done
        self._turns = turns
        self._limits = make_limits(make_settings(tmp_path))

    async def start_run(self, *args: Any, **kwargs: Any) -> ActiveRun:
        request = RunRequest(query="q", context_ids=["c"], limits=self._limits, owner=LOCAL_OWNER)
        run = ActiveRun("run_fast", request, RunProgress(run_id="run_fast", max_iterations=20))
        run.progress.iterations = self._turns
        run.result = RunResult(
            status="completed", answer="42", reason=None, run_id="run_fast", iterations=self._turns,
            usage=Usage(), duration_s=0.01, sub_calls=0,
        )  # fmt: skip
        run.done.set()
        return run


@pytest.mark.parametrize("turns", [1, 3])
async def test_a_run_that_ended_before_the_waiter_woke_still_names_each_turn(turns: int, tmp_path: Path) -> None:
    sent: list[tuple[float, str]] = []

    async def report(progress: float, total: float | None, message: str) -> None:
        sent.append((progress, message))

    result = await _FinishedAlready(turns, tmp_path).complete("q", "c", RunOverrides(), report)
    assert result.status == "completed"
    assert [m for _, m in sent] == ["run run_fast started", *(f"turn {k}/20" for k in range(1, turns + 1))]
    values = [v for v, _ in sent]
    assert values == sorted(set(values))  # strictly increasing
