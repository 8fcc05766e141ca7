"""Latency as a load signal (RLM_MCP_LM_QUEUEING_CUT): against the scripted server's latency
model, an endpoint that serves 4 calls at once and queues the rest, a client allowed 32 learns a
limit near 4 and keeps its calls in flight near it; once the endpoint serves 32 at once, the limit
grows back. Conditions are waited for with generous deadlines; nothing asserts on a duration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from prometheus_client import REGISTRY

from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.queueing import QueueingSignal, cell
from rlm_mcp.lm.throttle import Gate
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.settings import make_settings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Say ok."}]


async def load(client: LMClient, workers: int, done: Callable[[], bool], deadline_s: float = 180.0) -> int:
    """`workers` tasks calling the sub endpoint back to back until `done()`; the calls made.
    Past the deadline: an AssertionError that says where the gates stood."""
    made = 0

    async def worker() -> None:
        nonlocal made
        while not done():
            await client.complete(MESSAGES, model="rlm-v0.1", max_tokens=16, role="sub")
            made += 1

    try:
        with anyio.fail_after(deadline_s):
            async with anyio.create_task_group() as tg:
                for _ in range(workers):
                    tg.start_soon(worker)
    except TimeoutError:
        raise AssertionError(f"not reached after {made} calls: {client.throttles.states()}") from None
    return made


async def test_the_limit_settles_near_the_endpoints_concurrency_and_grows_back(tmp_path: Path) -> None:
    # 0.25 s a call: the client's own overhead on a loaded 2-core machine (a few ms a call) and a
    # stall of the shared process (the scripted server is a thread of it: a collection, a busy
    # neighbour) stay small beside it, and the ratios the limit moves on (2 and 4/3) are medians
    # of whole rounds.
    script = {"delay_s": 0.25, "max_concurrency": 4, "sub_default": "ok"}
    async with ScriptedLM(script) as lm:
        settings = make_settings(tmp_path, base_url=lm.base_url, max_concurrent_lm_calls=32, lm_queueing_cut=2.0)
        async with LMClient(settings.lm, backoff_base_s=0.05) as client:
            gate = client.throttles.gate("root", lm.base_url, "rlm-v0.1")
            assert gate.allowed == 32 and lm.max_in_flight == 0
            counted = REGISTRY.get_sample_value("rlm_mcp_lm_queueing_cuts_total", {"endpoint": "root"}) or 0.0
            # The endpoint is first met idle: its unqueued latency is the baseline (a client whose
            # first calls already queue learns that latency as the norm, as TCP Vegas does). A few
            # calls, one at a time: the first also opens the connection, which on a loaded machine
            # can take long enough to raise the baseline and with it the band the limit settles in.
            for _ in range(3):
                await client.complete(MESSAGES, model="rlm-v0.1", max_tokens=16, role="sub")

            # Cut at least twice (32 -> ~17 -> ~8) to 8 or less: with the cut ratio 2, 8 in flight
            # behind a queue that serves 4 doubles the latency.
            await load(client, 32, lambda: gate.queueing_cuts >= 2 and gate.allowed <= 8)
            assert lm.max_in_flight > 8  # the first round did reach the queue: there was something to learn
            # From now on the limit stays in the band the ratios allow, 4 to 8 calls in flight, give
            # or take the round it takes to see a change (one more place per round of answers),
            # with 32 callers asking, for 50 answers: a dozen rounds of the 4 the endpoint serves.
            with lm._lock:
                lm.max_in_flight = lm.in_flight
            settled: list[int] = []
            start = len(lm.requests)

            def watched() -> bool:
                settled.append(gate.allowed)
                return len(lm.requests) - start >= 50

            await load(client, 32, watched)
            assert min(settled) >= 2 and max(settled) <= 10, (min(settled), max(settled))
            assert lm.max_in_flight <= 10, lm.max_in_flight
            assert gate.in_flight == 0 and gate.throttled_answers == 0  # latency, never a 429, did this

            # The endpoint scales out: 32 at once, nothing queues, so the limit climbs back past
            # the band it was held in.
            lm.add_capacity(28)
            await load(client, 32, lambda: gate.allowed >= 12)
            assert gate.state()["latency_ratio"] is not None
            cuts = REGISTRY.get_sample_value("rlm_mcp_lm_queueing_cuts_total", {"endpoint": "root"})
            assert cuts == counted + gate.queueing_cuts  # /metrics counts them


async def test_off_by_default_latency_does_not_move_the_limit(tmp_path: Path) -> None:
    script = {"delay_s": 0.02, "max_concurrency": 2, "sub_default": "ok"}
    async with ScriptedLM(script) as lm:
        settings = make_settings(tmp_path, base_url=lm.base_url, max_concurrent_lm_calls=16)
        assert settings.lm.lm_queueing_cut == 0
        async with LMClient(settings.lm) as client:
            gate = client.throttles.gate("root", lm.base_url, "rlm-v0.1")
            made = await load(client, 16, lambda: len(lm.requests) >= 64)
    assert made >= 64 and gate.queueing is None
    assert gate.allowed == 16 and gate.cuts == 0 and lm.max_in_flight == 16


def test_a_round_decides_on_its_median_and_holds_between_the_ratios() -> None:
    signal = QueueingSignal(2.0)
    assert signal.clear_ratio == pytest.approx(4 / 3)
    assert signal.observe(1.0, 10, 10, 10.0, 4) is None  # the baseline
    for latency in (1.0, 1.1, 9.0):  # one slow call is noise: the median is 1.05
        verdict = signal.observe(latency, 10, 10, 10.0, 4)
    assert verdict == pytest.approx(1.05)
    for latency in (1.5, 1.6, 1.7, 1.5):  # between the ratios: hold
        verdict = signal.observe(latency, 10, 10, 20.0, 4)
    assert verdict == pytest.approx(1.55)
    for latency in (2.5, 2.5, 2.5, 2.5):
        verdict = signal.observe(latency, 10, 10, 30.0, 4)
    assert verdict == 2.5 and signal.factor(2.5) == pytest.approx((4 / 3) / 2.5)  # cut in proportion
    assert signal.factor(3.0) == 0.5  # never more than halved at once
    # A much longer answer is compared with its own size, not with the short ones.
    assert cell(10, 1000) != cell(10, 10)
    assert signal.observe(50.0, 10, 1000, 90.0, 4) is None and signal._round == [1.0]


def test_calls_sent_before_a_decision_do_not_count_in_the_next_round() -> None:
    signal = QueueingSignal(2.0)
    signal.observe(1.0, 1, 1, 1.0, 1)
    signal.restart(10.0)  # a cut at t=10
    assert signal.observe(5.0, 1, 1, 12.0, 1) is None  # sent at 7: under the old limit
    assert signal._round == []
    signal.observe(1.0, 1, 1, 12.0, 1)  # sent at 11: counts
    assert signal._round == [1.0]


def test_at_the_floor_a_slow_endpoint_is_rebased_not_read_as_queueing() -> None:
    signal = QueueingSignal(2.0)
    signal.observe(1.0, 1, 1, 1.0, 1)
    for _ in range(3):
        verdict = signal.observe(3.0, 1, 1, 10.0, 1)
    assert verdict == 1.0  # one in flight queues behind nothing of ours: no cut, it may grow
    assert signal.last_median == 3.0
    for _ in range(4):
        verdict = signal.observe(3.0, 1, 1, 20.0, 1)
    assert verdict == pytest.approx(1.0)  # the new normal


def test_a_held_gate_does_not_grow_and_a_cut_one_grows_only_once_clear() -> None:
    gate = Gate("sub", "http://x/v1", "m", ceiling=16, queueing_cut=2.0)
    clock = iter(range(1000, 10**6, 10))  # each call answered 10 s after the last: after any decision
    for _ in range(16):
        gate.answered_in(1.0, 10, 10, next(clock))
    assert gate.allowed == 16 and gate.cuts == 0
    gate.limit = 8.0
    for _ in range(8):
        gate.answered_in(1.5, 10, 10, next(clock))  # a round in the hold band
    before = gate.limit
    gate.answered()
    assert gate.limit == before  # held: no growth
    for _ in range(8):
        gate.answered_in(4.0, 10, 10, next(clock))
    assert gate.queueing_cuts == 1 and gate.allowed == 4  # 8 × max(½, (4/3)/4) = 4
    for _ in range(4):
        gate.answered_in(1.0, 10, 10, next(clock))
    gate.answered()
    assert gate.limit > 4  # clear again: it grows
