"""Back-pressure in one process: against a loopback endpoint that answers 429 past 4 calls in
flight, the client's limit for that endpoint and model falls to what it accepts, no run fails on
the storm, /metrics shows the limit and the 429s; the limit climbs back once the storm clears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY

from rlm_mcp.engine import RLMEngine, RunProgress
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.throttle import Gate
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeSandboxFactory, make_context, make_limits
from tests.fixtures_throttle import Refusals, refusing_endpoint

pytestmark = pytest.mark.anyio


async def runs(url: str, tmp_path: Path, names: list[str], lm: LMClient | None = None) -> list[str]:
    settings = make_settings(tmp_path, base_url=url, model="rlm-v0.1", max_iterations=3, lm_retries=1)
    statuses: list[str] = []

    async def sink(event: Any) -> None:
        pass

    async def one(client: LMClient, name: str) -> None:
        engine = RLMEngine(settings.engine, client, FakeSandboxFactory(), system_prompt=RLM_MCP_SYSTEM_PROMPT)
        limits = make_limits(settings, timeout_s=120)
        result = await engine.run(
            run_id=name,
            query="Count the parts.",
            contexts=[make_context(tmp_path, name=name)],
            limits=limits,
            progress=RunProgress(run_id=name, max_iterations=limits.max_iterations),
            emit=sink,
        )
        statuses.append(result.status)

    async def all_on(client: LMClient) -> None:
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(one, client, name)

    if lm is not None:
        await all_on(lm)
    else:
        async with LMClient(settings.lm, backoff_base_s=0.05) as client:
            await all_on(client)
    return statuses


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_429_storm_lowers_the_limit_and_no_run_fails(tmp_path: Path) -> None:
    state = Refusals(limit=4, batch=32)
    before = sample("rlm_mcp_lm_throttled_total", endpoint="root", status="429")
    async with refusing_endpoint(state) as url:
        statuses = await runs(url, tmp_path, [f"run_{i}" for i in range(3)])
        limit = sample("rlm_mcp_lm_concurrency_limit", endpoint="root", model="rlm-v0.1")
    assert statuses == ["completed"] * 3
    # Every call answered: before, with lm_retries=1, 64 of the 96 sub-calls gave up on 429s.
    assert state.answered == 3 * (2 + 32)
    assert state.refused > 0  # it did refuse: the client had to learn
    # The overflow stays a fraction of the work, not a multiple of it.
    assert state.refused < state.answered, (state.refused, state.answered)
    # Down from the ceiling (16). Not to a fixed figure: the answers after the storm's last refusal
    # grow it back, one place per limit's worth, by as many as the storm's timing leaves.
    assert limit < 16, limit
    assert sample("rlm_mcp_lm_throttled_total", endpoint="root", status="429") - before == state.refused


async def test_the_limit_halves_once_per_round_and_climbs_back_when_answers_come() -> None:
    gate = Gate("root", "http://x/v1", "m", ceiling=16)
    sent = await gate.acquire()
    gate.release()
    assert gate.throttled(429, sent) and gate.allowed == 8
    assert not gate.throttled(429, sent)  # sent before that cut: already answered by it
    later = await gate.acquire()
    gate.release()
    assert gate.throttled(503, later) and gate.allowed == 4
    for _ in range(4):
        gate.answered()
    assert gate.allowed == 4  # additive: about one more place per limit's worth of answers
    for _ in range(5):
        gate.answered()
    assert gate.allowed == 5
    for _ in range(1000):
        gate.answered()
    assert gate.allowed == 16  # never past the ceiling


async def test_a_refusal_at_the_floor_cuts_and_publishes_nothing() -> None:
    gate = Gate("root", "http://x/v1", "m", ceiling=1)
    sent = await gate.acquire()
    gate.release()
    assert not gate.throttled(429, sent)  # nothing to cut: its caller publishes no cut either
    assert (gate.allowed, gate.cuts, gate.throttled_answers) == (1, 0, 1)


async def test_waiters_get_places_as_the_limit_allows() -> None:
    gate = Gate("root", "http://x/v1", "m", ceiling=2, start=1)
    await gate.acquire()
    got: list[int] = []

    async def wait_for_one(i: int) -> None:
        await gate.acquire()
        got.append(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_one, 1)
        tg.start_soon(wait_for_one, 2)
        await anyio.wait_all_tasks_blocked()
        assert got == [] and gate.in_flight == 1
        gate.answered()  # 1 + 1/1 = 2 places: one waiter goes
        await anyio.wait_all_tasks_blocked()
        assert got == [1]
        gate.release()
    assert got == [1, 2] and gate.in_flight == 2


async def test_a_refused_call_keeps_its_place_while_it_waits() -> None:
    # Handed on at once, the place sent the next call in line into the same refusal, and the next,
    # through the whole queue: 450-820 refusals for 204 calls in the two-worker storm test.
    state = Refusals(limit=0, batch=1, retry_after_ms=30_000)  # refuses everything, "come back in 30 s"
    messages = [{"role": "user", "content": "hi"}]
    async with refusing_endpoint(state) as url:
        settings = make_settings(base_url=url, model="rlm-v0.1", max_concurrent_lm_calls=1)
        async with LMClient(settings.lm) as client, anyio.create_task_group() as tg:
            gate = client.throttles.gate("root", url, "rlm-v0.1")
            for _ in range(2):
                tg.start_soon(lambda: client.complete(messages, model="rlm-v0.1", max_tokens=8, role="root"))
            await wait_until(lambda: gate.throttled_answers >= 1, within_s=30, what="the first refusal")
            await anyio.wait_all_tasks_blocked()
            # The refused call sleeps out its 30 s on its place; the second still waits for it.
            assert (gate.in_flight, gate.state()["waiting"], state.refused) == (1, 1, 1)
            tg.cancel_scope.cancel()
        assert gate.in_flight == 0  # a wait cancelled gives the place back
