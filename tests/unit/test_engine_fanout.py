"""A big sub-call batch: its first requests leave at once, its work per prompt happens next to
that prompt's request (engine/bridge.py `_gather`), and its answers stay in prompt order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from rlm_mcp.engine.bridge import _gather
from rlm_mcp.engine.tree import SUB_CALL_SLOT
from rlm_mcp.ports.chat import Completion
from tests.fixtures_engine import FakeChatModel, make_settings, repl, run_engine

pytestmark = pytest.mark.anyio

DONE = repl('answer["content"]="done"; answer["ready"]=True')


@dataclass
class SendingModel(FakeChatModel):
    """A sub-call's request leaves one loop turn after `complete` is entered, as the real client's
    does (aiohttp writes a request's body in a task of its own): `log` says, in order, when each
    prompt's call was entered ("enter") and when its request left ("sent"); `most` is the most
    sub-calls in progress at once."""

    log: list[tuple[str, str]] = field(default_factory=list)
    in_progress: int = 0
    most: int = 0

    async def complete(
        self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: str, session: str | None = None
    ) -> Completion:
        if role != "sub":
            return await super().complete(messages, model=model, max_tokens=max_tokens, role=role, session=session)
        prompt = messages[-1]["content"]
        self.in_progress += 1
        self.most = max(self.most, self.in_progress)
        try:
            self.log.append(("enter", prompt))
            await anyio.lowlevel.checkpoint()
            self.log.append(("sent", prompt))
            return await super().complete(messages, model=model, max_tokens=max_tokens, role=role, session=session)
        finally:
            self.in_progress -= 1


def _batch(n: int) -> str:
    return repl(f"r = llm_query_batched(['p%d' % i for i in range({n})])\nprint(r == ['P%d' % i for i in range({n})])")


def _printed(lm: FakeChatModel) -> str:
    """What the batch's cell printed, as the second root call was shown it."""
    output = next(m["content"] for m in lm.root_calls[1].messages if "REPL output" in m["content"])
    return "True" if "True" in output else output


async def test_a_big_batch_sends_its_first_request_before_preparing_the_others(tmp_path: Path) -> None:
    # 64 prompts, 16 slots: the first request leaves before the 16th prompt's call is even begun
    # (before, all 64 calls were begun first; with 16 tasks started at once, all 16).
    settings = make_settings(tmp_path, max_concurrent_lm_calls=16)
    lm = SendingModel(root=[_batch(64), DONE], sub=str.upper)
    result, *_ = await run_engine(tmp_path, lm, settings=settings)
    assert result.status == "completed" and result.sub_calls == 64
    assert lm.log.index(("sent", "p0")) < lm.log.index(("enter", "p15"))
    assert _printed(lm) == "True"  # answers in prompt order


async def test_a_batch_works_on_at_most_as_many_prompts_as_the_lm_slots(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_concurrent_lm_calls=4)
    lm = SendingModel(root=[_batch(40), DONE], sub=str.upper)
    result, events, *_ = await run_engine(tmp_path, lm, settings=settings)
    assert result.status == "completed" and result.sub_calls == 40
    assert lm.most == 4  # before, all 40 prompts were under way at once
    assert _printed(lm) == "True"
    # prompts are taken in order, and every call still names its batch and its own slot
    assert [p for kind, p in lm.log if kind == "enter"] == [f"p{i}" for i in range(40)]
    calls = [e for e in events.of("llm_call") if e["role"] == "sub"]
    assert sorted(e["index"] for e in calls) == list(range(40))
    assert {e["batch"] for e in calls} == {events.of("sub_calls")[0]["batch"]}
    assert all(e["prompt"] == f"p{e['index']}" for e in calls)


async def test_a_single_prompt_names_its_batch_and_slot_and_only_its_own_events(tmp_path: Path) -> None:
    # One prompt is answered in the requesting task itself (no task group): its call still names
    # its own batch and slot 0, and the root calls around it name none.
    one = repl("a = llm_query('p0')\nb = llm_query('p1')\nprint(a, b)")
    lm = SendingModel(root=[one, DONE], sub=str.upper)
    result, events, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed" and result.sub_calls == 2
    subs = [e for e in events.of("llm_call") if e["role"] == "sub"]
    batches = [e["batch"] for e in events.of("sub_calls")]
    assert [(e["batch"], e["index"], e["prompt"]) for e in subs] == [(batches[0], 0, "p0"), (batches[1], 0, "p1")]
    roots = [e for e in events.of("llm_call") if e["role"] == "root"]
    assert len(roots) == 2 and all(e.get("batch") is None and e.get("index") is None for e in roots)
    assert "P0 P1" in next(m["content"] for m in lm.root_calls[1].messages if "REPL output" in m["content"])


@pytest.mark.parametrize(("prompts", "width"), [(16, 16), (40, 8)])
async def test_a_cancelled_batch_ends_every_call_it_began_before_it_returns(prompts: int, width: int) -> None:
    # The batch's calls run in tasks of their own: cancelling the batch (its cell ended, its run
    # was cancelled) cancels each of them, and the batch returns only once every call it began
    # has ended, its cleanup (which awaits) included. 16 of 16: all started at once; 40 over 8:
    # cancelled while the tasks are still being started in rounds.
    began: list[str] = []
    ended: list[str] = []

    async def worker(prompt: str) -> str:
        began.append(prompt)
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()  # a cleanup that awaits, as a request's does
            ended.append(prompt)
        return prompt

    returned = False
    async with anyio.create_task_group() as tg:

        async def batch() -> None:
            nonlocal returned
            await _gather([f"p{i}" for i in range(prompts)], worker, 1, width)
            returned = True

        tg.start_soon(batch)
        while len(began) < (width if prompts == width else 1):
            await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    assert began and sorted(ended) == sorted(began)
    assert not returned
    assert len(began) <= width


async def test_a_batch_answers_in_prompt_order_and_each_call_names_its_slot() -> None:
    # Each task's calls name their own (batch, index) slot: set in the task's own context, not
    # the caller's, which keeps its own.
    seen: dict[str, tuple[int, int] | None] = {}

    async def worker(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        seen[prompt] = SUB_CALL_SLOT.get()
        if prompt == "p3":
            raise ValueError("broken")
        return prompt.upper()

    results = await _gather([f"p{i}" for i in range(10)], worker, 7, 4)
    assert results == [f"P{i}" if i != 3 else "Error: the sub-call failed: ValueError: broken" for i in range(10)]
    assert seen == {f"p{i}": (7, i) for i in range(10)}
    assert SUB_CALL_SLOT.get() is None
