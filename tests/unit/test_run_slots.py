"""Embedded mode's run slots: the per-owner waiting bound holds under concurrent starts, and each
owner holds at most its share of the slots (a run over it waits without taking a slot)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import BusyError
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.run_queue import configured_owners, owner_run_share
from rlm_mcp.service.runs import RunManager
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings

pytestmark = pytest.mark.anyio

ALICE, BOB = Owner("alice"), Owner("bob")


@asynccontextmanager
async def manager(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[RunManager, RLMEngine, list[str]]]:
    """A RunManager over real stores and a real engine whose root model answers after an hour:
    every run that gets a slot holds it (until the manager's shutdown cancels it)."""
    settings = make_settings(tmp_path, **overrides)
    engine = RLMEngine(settings.engine, FakeChatModel(root_delay_s=3600), FakeSandboxFactory())
    async with (
        make_stores(settings) as stores,
        RunManager(settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server)) as runs,
    ):
        ids = []
        for owner in (ALICE, BOB):
            info = await stores.contexts.put_bytes(
                b"The magic number is 42.", name="ctx", format="text", source={"kind": "text"}, owner=owner
            )
            ids.append(info.context_id)
        yield runs, engine, ids


def request(owner: Owner, context_id: str, settings_path: Path) -> RunRequest:
    limits = make_limits(make_settings(settings_path))
    return RunRequest(query="q", context_ids=[context_id], limits=limits, owner=owner)


def is_running(run: ActiveRun) -> bool:
    return run.progress.status == "running"


def statuses(runs: list[ActiveRun]) -> list[str]:
    return sorted(r.progress.status for r in runs)


async def test_the_waiting_bound_holds_under_concurrent_starts(tmp_path: Path) -> None:
    async with manager(tmp_path, max_runs=2, run_max_queued_per_owner=20, run_max_queued=64) as (mgr, engine, ids):
        accepted: list[ActiveRun] = []
        refused: list[BusyError] = []

        async def start() -> None:
            try:
                accepted.append(await mgr.start(request(ALICE, ids[0], tmp_path), engine))
            except BusyError as exc:
                refused.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(start)
        assert (len(accepted), len(refused)) == (22, 10)  # 20 waiting + the 2 that took the slots
        assert all("RLM_MCP_RUN_MAX_QUEUED_PER_OWNER=20" in str(e) for e in refused)
        await wait_until(lambda: statuses(accepted).count("running") == 2, within_s=30)
        assert statuses(accepted) == ["queued"] * 20 + ["running"] * 2
        with pytest.raises(BusyError):  # still full
            await mgr.start(request(ALICE, ids[0], tmp_path), engine)


async def test_an_owner_over_its_share_waits_while_another_owner_runs(tmp_path: Path) -> None:
    settings = {"max_runs": 4, "auth_tokens": ["token-a", "token-b"], "run_queue_timeout_s": 600}
    async with manager(tmp_path, **settings) as (mgr, engine, ids):
        mine = [await mgr.start(request(ALICE, ids[0], tmp_path), engine) for _ in range(4)]
        await wait_until(lambda: statuses(mine) == ["queued", "queued", "running", "running"], within_s=30)
        # Two slots are free, yet alice's two other runs wait: they are over her share of 2.
        assert mgr._gate.free == 2 and mgr._gate.share == 2
        theirs = await mgr.start(request(BOB, ids[1], tmp_path), engine)
        await wait_until(lambda: theirs.progress.status == "running", within_s=30)
        assert statuses(mine) == ["queued", "queued", "running", "running"]
        # One of alice's runs ends: one of her waiting runs takes its slot, and only one.
        first_running = next(r for r in mine if r.progress.status == "running")
        await mgr.cancel(first_running.run_id)
        await wait_until(lambda: statuses(mine) == ["cancelled", "queued", "running", "running"], within_s=30)
        assert mgr._gate.running(ALICE) == 2 and mgr._gate.free == 1


async def test_waiting_runs_take_the_slot_in_the_order_they_were_started(tmp_path: Path) -> None:
    """Each run creates its record and pins its contexts before it waits: its place in the line
    is taken before those awaits, so a run started later never overtakes one started before."""
    async with manager(tmp_path, max_runs=1, run_queue_timeout_s=600) as (mgr, engine, ids):
        started = [await mgr.start(request(ALICE, ids[0], tmp_path), engine) for _ in range(4)]
        for index, run in enumerate(started):
            await wait_until(functools.partial(is_running, run), within_s=30)
            assert [r.progress.status for r in started[index + 1 :]] == ["queued"] * (3 - index)
            await mgr.cancel(run.run_id)


async def test_a_run_over_its_share_ends_naming_the_share_when_it_waits_too_long(tmp_path: Path) -> None:
    settings = {"max_runs": 2, "max_runs_per_owner": 1, "run_queue_timeout_s": 0.5}
    async with manager(tmp_path, **settings) as (mgr, engine, ids):
        first = await mgr.start(request(ALICE, ids[0], tmp_path), engine)
        await wait_until(lambda: first.progress.status == "running", within_s=30)
        second = await mgr.start(request(ALICE, ids[0], tmp_path), engine)
        with anyio.fail_after(30):
            await second.done.wait()
        assert second.not_started is not None
        assert "RLM_MCP_MAX_RUNS_PER_OWNER=1" in str(second.not_started) and "your share" in str(second.not_started)


def _share(tmp_path: Path, *, slots: int | None = None, **overrides: Any) -> int:
    settings = make_settings(tmp_path, **overrides)
    return owner_run_share(settings.runs, owners=configured_owners(settings.server), slots=slots)


def test_the_share_is_all_slots_for_one_owner_and_half_for_several(tmp_path: Path) -> None:
    assert _share(tmp_path, max_runs=5) == 5  # stdio, or one token
    assert _share(tmp_path, max_runs=5, auth_token="only") == 5
    assert _share(tmp_path, max_runs=5, auth_tokens=["a", "b", "c"]) == 3
    assert _share(tmp_path, max_runs=1, auth_tokens=["a", "b"]) == 1
    assert _share(tmp_path, max_runs=5, max_runs_per_owner=2) == 2
    assert _share(tmp_path, max_runs=5, max_runs_per_owner=9) == 5
    tokens = tmp_path / "tokens"
    tokens.write_text("# the team\none\ntwo\n")
    assert _share(tmp_path, max_runs=4, auth_tokens_file=tokens) == 2
    # Team mode asks for the share of every live worker's slots.
    assert _share(tmp_path, max_runs=4, auth_tokens=["a", "b"], slots=12) == 6
