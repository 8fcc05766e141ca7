"""A run that takes its slot at once creates its record beside its first LM call (the engine's
`ready` step), not before it; what a caller sees does not move: `start` returns only once the
record exists (also when the run's first request waits on the LM endpoint), the run's log holds
its events in order from `run_start`, and a record the store refuses fails the call with the
store's error and leaves no run behind, as when the record came first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunEnded, RunRecord, RunRequest
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.store.ports import RunLogPort
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings, submit

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")
TEXT = b"The magic number is 42."


def _manager(settings: Any, stores: Any, *, records: Any = None, ends: RunEnds | None = None) -> RunManager:
    """The run manager of these tests, on the stores' run store unless `records` replaces it."""
    run_store = stores.runs if records is None else records
    return RunManager(settings.runs, stores.contexts, run_store, owners=configured_owners(settings.server), ends=ends)


def _summaries(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "runs").glob("*/summary.json"))


async def test_the_first_request_goes_out_before_the_record_and_start_returns_after_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    data_dir = Path(settings.store.data_dir)
    recorded_at_first_call: list[bool] = []

    def reply(messages: list[dict[str, str]], index: int) -> str:
        recorded_at_first_call.append(bool(_summaries(data_dir)))
        return submit("'42'")

    engine = RLMEngine(settings.engine, FakeChatModel(root=reply), FakeSandboxFactory())
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(TEXT, name="ctx", format="text", source={"kind": "text"}, owner=ALICE)
        async with _manager(settings, stores) as runs:
            request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
            run = await runs.start(request, engine, contexts=[stores.contexts.spec(info)])
            first = await stores.runs.read_summary(run.run_id, owner=ALICE)  # there once `start` returned
            with anyio.fail_after(30):
                await run.done.wait()
            final = await stores.runs.read_summary(run.run_id, owner=ALICE)
    assert recorded_at_first_call == [False]
    assert first.run_id == run.run_id
    assert final.status == "completed" and final.result is not None and final.result.answer == "42"
    lines = (data_dir / "runs" / run.run_id / "events.jsonl").read_text(encoding="utf-8").splitlines()
    types = [json.loads(line)["type"] for line in lines]
    assert types[:2] == ["run_start", "turn_start"] and types[-1] == "run_end"


class _SlowWindow(FakeChatModel):
    """An endpoint whose window is asked for before the first request and answers only when told."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answer = anyio.Event()

    async def window(self, model: str, *, role: str = "root") -> int:
        await self.answer.wait()
        return await super().window(model, role=role)


async def test_start_does_not_wait_for_the_lm_endpoint_before_the_first_request(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    lm = _SlowWindow(root=[submit("'42'")])
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory())
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(TEXT, name="ctx", format="text", source={"kind": "text"}, owner=ALICE)
        async with _manager(settings, stores) as runs:
            request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
            with anyio.fail_after(30):
                run = await runs.start(request, engine, contexts=[stores.contexts.spec(info)])
            assert not lm.answer.is_set() and lm.root_calls == []  # no request yet; the record exists
            stored = await stores.runs.read_summary(run.run_id, owner=ALICE)
            lm.answer.set()
            with anyio.fail_after(30):
                await run.done.wait()
            final = await stores.runs.read_summary(run.run_id, owner=ALICE)
    assert stored.status == "queued"  # the record as the run was accepted
    assert final.status == "completed"
    assert [
        json.loads(line)["type"]
        for line in (Path(settings.store.data_dir) / "runs" / run.run_id / "events.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()
    ][:2] == ["run_start", "turn_start"]


def _finished() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "rlm_mcp_runs_finished"
        for sample in metric.samples
        if sample.name == "rlm_mcp_runs_finished_total"
    )


def _running() -> float:
    return REGISTRY.get_sample_value("rlm_mcp_runs_running") or 0.0


class _Refusing:
    """The run store, refusing every new record (a full disk)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def create(self, record: RunRecord) -> RunLogPort:
        raise OSError(28, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("late", [True, False], ids=["slot-at-once", "record-first"])
async def test_a_refused_record_fails_the_call_and_leaves_no_run(tmp_path: Path, late: bool) -> None:
    settings = make_settings(tmp_path)
    told: list[RunEnded] = []
    withdrawn: list[str] = []

    async def hook(ended: RunEnded) -> None:
        told.append(ended)

    async def withdrawal(run_id: str) -> None:
        withdrawn.append(run_id)

    ends = RunEnds([hook])
    ends.subscribe_withdrawn(withdrawal)
    lm = FakeChatModel(root=[submit("'42'")])
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory())
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(TEXT, name="ctx", format="text", source={"kind": "text"}, owner=ALICE)
        async with _manager(settings, stores, records=_Refusing(stores.runs), ends=ends) as runs:
            request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
            finished, running = _finished(), _running()
            with pytest.raises(OSError, match="No space left on device"), anyio.fail_after(30):
                await runs.start(request, engine, contexts=[stores.contexts.spec(info)] if late else None)
            # a run never accepted is not counted as finished (in any status) nor left running
            assert (_finished(), _running()) == (finished, running)
            # the contexts are not held by a run that never was
            assert await stores.contexts.delete(info.context_id, owner=ALICE)
    assert told == []
    assert _summaries(Path(settings.store.data_dir)) == []
    # the withdrawal is told once, so that what its first request left (a router's session) is
    # released: with the record beside the first request, that request went out
    assert len(withdrawn) == 1 and withdrawn[0].startswith("run_")
    assert len(lm.root_calls) == (1 if late else 0)
