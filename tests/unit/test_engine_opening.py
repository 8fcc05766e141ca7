"""The sandbox opens beside the first root call (engine/opening.py): the first call is sent
while the sandbox is still opening, its reply is taken once the sandbox is open, and every way
either side can fail or be stopped meanwhile ends the run the way it ended before the overlap."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.engine import RLMEngine, RunNotStarted, RunPhase, RunProgress
from rlm_mcp.engine.session import SessionSandbox
from rlm_mcp.errors import SandboxError
from rlm_mcp.ports import ContextSpec
from rlm_mcp.ports.chat import Completion, LMConnectionError
from tests.fixtures_engine import (
    Events,
    FakeChatModel,
    FakeSandbox,
    make_context,
    make_limits,
    make_settings,
    submit,
)

pytestmark = pytest.mark.anyio

GUARD_S = 30  # a hang guard only: each wait below ends on an event, never on time


@dataclass
class Journal:
    """What happened, in the order it happened, across the LM and the sandbox factory."""

    entries: list[str] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def add(self, entry: str) -> None:
        self.entries.append(entry)
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, entry: str) -> None:
        with anyio.fail_after(GUARD_S):
            while entry not in self.entries:
                await self.changed.wait()


@dataclass
class JournalLM(FakeChatModel):
    """The scripted model, journaling each root request and reply; `hold` keeps a root call
    in flight until it returns (or the call is cancelled: journaled too)."""

    journal: Journal = field(default_factory=Journal)
    hold: Callable[[], Awaitable[None]] | None = None

    async def complete(
        self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: str, session: str | None = None
    ) -> Completion:
        if role != "root":
            return await super().complete(messages, model=model, max_tokens=max_tokens, role=role, session=session)
        self.journal.add("lm request")
        try:
            if self.hold is not None:
                await self.hold()
            completion = await super().complete(
                messages, model=model, max_tokens=max_tokens, role=role, session=session
            )
        except anyio.get_cancelled_exc_class():
            self.journal.add("lm cancelled")
            raise
        self.journal.add("lm reply")
        return completion


class SlowFactory:
    """A sandbox factory whose opening waits for `gate` (what the test makes it wait for: the
    LM request, the LM reply, or nothing ever), then opens an in-process sandbox or fails."""

    def __init__(self, journal: Journal, gate: Callable[[], Awaitable[None]], *, fail: bool = False) -> None:
        self.journal = journal
        self.gate = gate
        self.fail = fail
        self.closed = 0

    def __call__(self, contexts: Sequence[ContextSpec], *, levels_below: int = 0, kept: bool = False) -> Any:
        @asynccontextmanager
        async def _cm() -> AsyncIterator[FakeSandbox]:
            self.journal.add("open start")
            try:
                await self.gate()
            except anyio.get_cancelled_exc_class():
                self.journal.add("open cancelled")
                raise
            if self.fail:
                self.journal.add("open failed")
                raise SandboxError("The sandbox could not start.", "Start Docker.")
            box = FakeSandbox(contexts)
            self.journal.add("open done")
            try:
                yield box
            finally:
                box.closed.set()
                self.closed += 1

        return _cm()


async def forever() -> None:
    await anyio.sleep_forever()


async def run(
    tmp_path: Path,
    lm: FakeChatModel,
    factory: SlowFactory,
    *,
    session: SessionSandbox | None = None,
    progress: RunProgress | None = None,
    **limits: Any,
) -> tuple[Any, Events]:
    settings = make_settings()
    events = Events()
    engine = RLMEngine(settings.engine, lm, factory, system_prompt="SYS")
    result = await engine.run(
        run_id="run-1",
        query="What is the magic number?",
        contexts=[make_context(tmp_path)],
        limits=make_limits(settings, max_iterations=4, **limits),
        progress=progress or RunProgress(run_id="run-1", max_iterations=4),
        emit=events,
        session=session,
    )
    return result, events


async def test_the_first_root_call_is_sent_while_the_sandbox_opens(tmp_path: Path) -> None:
    journal = Journal()
    lm = JournalLM(root=[submit('"42"')], journal=journal)
    # The opening finishes only once the first root request has arrived: without the overlap
    # (the sandbox opened before the first call) it would wait for a request that never comes.
    factory = SlowFactory(journal, lambda: journal.wait_for("lm request"))
    with anyio.fail_after(GUARD_S):
        result, events = await run(tmp_path, lm, factory)
    assert result.status == "completed" and result.answer == "42"
    assert journal.entries.index("lm request") < journal.entries.index("open done")
    assert factory.closed == 1
    types = [e["type"] for e in events.items]
    # The log reads as before: the reply is logged once the sandbox is open, then the cell.
    assert types[:3] == ["run_start", "turn_start", "llm_call"]
    assert types.index("llm_call") < types.index("cell_start") < types.index("cell") < types.index("turn")
    assert types[-1] == "run_end"


async def test_a_reply_that_comes_first_waits_for_the_sandbox_in_the_sandbox_phase(tmp_path: Path) -> None:
    journal = Journal()
    lm = JournalLM(root=[submit('"42"')], journal=journal)
    progress = RunProgress(run_id="run-1", max_iterations=4)
    seen: list[RunPhase] = []

    async def after_the_reply() -> None:
        await journal.wait_for("lm reply")
        await anyio.wait_all_tasks_blocked()  # the loop is waiting for this opening now
        seen.append(progress.phase)

    factory = SlowFactory(journal, after_the_reply)
    with anyio.fail_after(GUARD_S):
        result, events = await run(tmp_path, lm, factory, progress=progress)
    assert result.status == "completed"
    assert seen == [RunPhase.SANDBOX]
    assert journal.entries.index("lm reply") < journal.entries.index("open done")


async def test_a_sandbox_that_cannot_open_cancels_the_call_in_flight_and_the_run_never_started(
    tmp_path: Path,
) -> None:
    journal = Journal()
    lm = JournalLM(root=[submit('"42"')], journal=journal, hold=forever)
    factory = SlowFactory(journal, lambda: journal.wait_for("lm request"), fail=True)
    events = Events()
    with anyio.fail_after(GUARD_S), pytest.raises(RunNotStarted) as raised:
        settings = make_settings()
        engine = RLMEngine(settings.engine, lm, factory, system_prompt="SYS")
        await engine.run(
            run_id="run-1",
            query="q",
            contexts=[make_context(tmp_path)],
            limits=make_limits(settings),
            progress=RunProgress(run_id="run-1", max_iterations=4),
            emit=events,
        )
    assert raised.value.cause.fix == "Start Docker."
    assert "lm cancelled" in journal.entries
    assert journal.entries.index("open failed") < journal.entries.index("lm cancelled")
    (end,) = events.of("run_end")
    assert end["status"] == "error" and "could not start" in end["reason"]
    assert not events.of("llm_call")


async def test_a_reply_that_came_before_the_sandbox_failed_is_not_taken(tmp_path: Path) -> None:
    journal = Journal()
    lm = JournalLM(root=[submit('"42"')], journal=journal)
    factory = SlowFactory(journal, lambda: journal.wait_for("lm reply"), fail=True)
    progress = RunProgress(run_id="run-1", max_iterations=4)
    events = Events()
    settings = make_settings()
    engine = RLMEngine(settings.engine, lm, factory, system_prompt="SYS")
    with anyio.fail_after(GUARD_S), pytest.raises(RunNotStarted):
        await engine.run(
            run_id="run-1",
            query="q",
            contexts=[make_context(tmp_path)],
            limits=make_limits(settings),
            progress=progress,
            emit=events,
        )
    # Not started: no answered call counted (a team worker may hand such a run back), none logged.
    assert progress.usage.total.calls == 0
    assert not events.of("llm_call") and not events.of("cell_start")


async def test_a_first_call_that_fails_abandons_a_one_run_opening(tmp_path: Path) -> None:
    journal = Journal()
    # The call fails once the opening is under way (it starts once the request is on its way).
    lm = JournalLM(
        root=[LMConnectionError("connection refused", endpoint="http://lm/v1")],
        journal=journal,
        hold=lambda: journal.wait_for("open start"),
    )
    factory = SlowFactory(journal, forever)
    with anyio.fail_after(GUARD_S), pytest.raises(RunNotStarted) as raised:
        await run(tmp_path, lm, factory)
    assert "connection refused" in str(raised.value)
    assert "open cancelled" in journal.entries and factory.closed == 0


async def test_a_first_call_that_fails_lets_a_sessions_opening_finish(tmp_path: Path) -> None:
    journal = Journal()
    lm = JournalLM(root=[LMConnectionError("connection refused", endpoint="http://lm/v1")], journal=journal)
    factory = SlowFactory(journal, lambda: journal.wait_for("lm request"))
    session = SessionSandbox("ses_test")
    try:
        with anyio.fail_after(GUARD_S), pytest.raises(RunNotStarted):
            await run(tmp_path, lm, factory, session=session)
        # The REPL the session keeps holds what the session counts (as when the sandbox opened
        # before the call): context_0, bound by this run.
        assert "open done" in journal.entries and "open cancelled" not in journal.entries
        assert session.live and session.context_count == 1 and session.runs == 1
    finally:
        await session.release()
    assert factory.closed == 1


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_stopped_while_both_are_in_flight(tmp_path: Path, how: str) -> None:
    journal = Journal()
    lm = JournalLM(root=[submit('"42"')], journal=journal, hold=forever)
    factory = SlowFactory(journal, forever)
    events = Events()
    settings = make_settings()
    engine = RLMEngine(settings.engine, lm, factory, system_prompt="SYS")
    ended: list[str] = []

    async def go() -> None:
        result = await engine.run(
            run_id="run-1",
            query="q",
            contexts=[make_context(tmp_path)],
            limits=make_limits(settings, timeout_s=2 if how == "timeout" else 600),  # 2 s: both in flight first
            progress=RunProgress(run_id="run-1", max_iterations=4),
            emit=events,
        )
        ended.append(result.status)

    with anyio.fail_after(GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(go)
            await journal.wait_for("lm request")
            await journal.wait_for("open start")
            if how == "cancel":
                tg.cancel_scope.cancel()
    assert "lm cancelled" in journal.entries and "open cancelled" in journal.entries
    (end,) = events.of("run_end")
    assert end["status"] == ("cancelled" if how == "cancel" else "timeout")
    assert ended == ([] if how == "cancel" else ["timeout"])


class YieldingEvents(Events):
    """A sink that yields to the event loop on each event, as the run log's writes may."""

    async def __call__(self, event: Any) -> None:
        await anyio.lowlevel.checkpoint()
        await super().__call__(event)


async def test_the_opening_starts_once_the_first_root_request_is_on_its_way(tmp_path: Path) -> None:
    journal = Journal()
    lm = JournalLM(root=[submit('"42"')], journal=journal)
    factory = SlowFactory(journal, anyio.lowlevel.checkpoint)
    settings = make_settings()
    engine = RLMEngine(settings.engine, lm, factory, system_prompt="SYS")
    with anyio.fail_after(GUARD_S):
        result = await engine.run(
            run_id="run-1",
            query="q",
            contexts=[make_context(tmp_path)],
            limits=make_limits(settings, max_iterations=4),
            progress=RunProgress(run_id="run-1", max_iterations=4),
            emit=YieldingEvents(),
        )
    assert result.status == "completed"
    # The opening's first steps run on the event loop: started with the run, they ran at the
    # loop's first yield, ahead of the request the run's critical path waits on.
    assert journal.entries.index("lm request") < journal.entries.index("open start")


@dataclass
class NoWindowLM(JournalLM):
    """A model whose window lookup fails: the loop ends before its first root call."""

    async def window(self, model: str, *, role: str = "root") -> int:
        raise LMConnectionError("connection refused", endpoint="http://lm/v1")


async def test_a_loop_that_ends_before_its_first_call_lets_a_sessions_opening_finish(tmp_path: Path) -> None:
    journal = Journal()
    lm = NoWindowLM(root=[submit('"42"')], journal=journal)
    factory = SlowFactory(journal, anyio.lowlevel.checkpoint)
    session = SessionSandbox("ses_test")
    try:
        with anyio.fail_after(GUARD_S), pytest.raises(RunNotStarted):
            await run(tmp_path, lm, factory, session=session)
        # No request was ever sent, yet the session's REPL opened (what the session counts).
        assert "lm request" not in journal.entries and "open done" in journal.entries
        assert session.live and session.context_count == 1
    finally:
        await session.release()
