"""The queue's follow rules (part of tests/fixtures_queue_rules.py's `RULES`): a worker publishes
a run's live summary at the live-summary interval for a run a front follows
(`QueueFront.follow_progress`), at the slower unfollowed interval for the others. Counted from
the live summaries a front's wake-ups carry (no timing assertion): the followed runs' model waits,
before each turn's LM call, until a live summary naming that turn was heard, so a followed run
that skipped a turn's publish would never end (`fail_after`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from rlm_mcp.engine import RunPhase
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.chat import Completion
from rlm_mcp.ports.runs import LiveSummary, RunRecord
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.wakeups import Wakeups
from tests.fixtures_engine import FakeChatModel, repl, submit
from tests.fixtures_queue_team import OpenTeam
from tests.fixtures_queue_worker_rules import _request_with_context, worker_on

TURNS = 6
WAIT_S = 30


class CountingWakeups(Wakeups):
    """The front's wake-ups, counting the live summaries each run's announcements carry and the
    highest turn they named."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.summaries: dict[str, int] = {}
        self.turns: dict[str, int] = {}
        self.heard = anyio.Event()

    def wake(self, run_id: str, summary: LiveSummary | RunRecord | None = None) -> None:
        if isinstance(summary, LiveSummary):
            self.summaries[run_id] = self.summaries.get(run_id, 0) + 1
            self.turns[run_id] = max(self.turns.get(run_id, 0), summary.iterations)
            self.heard.set()
            self.heard = anyio.Event()
        super().wake(run_id, summary)

    async def until_turn(self, run_id: str, turn: int) -> None:
        while self.turns.get(run_id, 0) < turn:
            await self.heard.wait()


@dataclass
class WatchedModel(FakeChatModel):
    """Before the LM call of each turn from `watch_from` on, waits until the front heard a live
    summary naming that turn; at turn `pause_at`, says so (`paused`) and waits for `go`."""

    wakeups: CountingWakeups | None = None
    run_id: str = ""
    watch_from: int = 1
    pause_at: int = 0
    paused: anyio.Event = field(default_factory=anyio.Event)
    go: anyio.Event = field(default_factory=anyio.Event)

    async def complete(
        self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: str, session: str | None = None
    ) -> Completion:
        turn = len(self.root_calls) + 1
        if role == "root" and self.wakeups is not None:
            if turn == self.pause_at:
                self.paused.set()
                await self.go.wait()
            if turn >= self.watch_from:
                await self.wakeups.until_turn(self.run_id, turn)
        return await super().complete(messages, model=model, max_tokens=max_tokens, role=role, session=session)


UNFOLLOWED_S = 1e6  # no tick of it falls within a run here, but once in ~10^6 s of runs


@asynccontextmanager
async def _team(open_team: OpenTeam) -> AsyncIterator[tuple[Any, RunRecord, CountingWakeups]]:
    """A team whose followed runs publish on every progress event and whose unfollowed ones
    publish at the ticks of a period of a million seconds (the first tick falls anywhere within a
    period of the claim, not a period after it: with a minute, a run of a second met one about
    once in sixty); a stored context's request to start runs from; a front's counting wake-ups."""
    async with open_team(
        queue_poll_s=0.2, live_summary_interval_s=0.0, live_summary_unfollowed_interval_s=UNFOLLOWED_S
    ) as team:
        record = await _request_with_context(team, "run_unused0000000000")
        yield team, record, CountingWakeups(team.queue)


def _turns() -> list[object]:
    return [*(repl(f"print({i})") for i in range(TURNS - 1)), submit("'42'")]


async def rule_an_unfollowed_run_publishes_fewer_live_summaries_than_turns(open_team: OpenTeam) -> None:
    """Nobody follows it: with the unfollowed interval longer than the run, no live summary for
    six turns (its first one waits for the interval's tick too, which the run does not live to
    see); every
    event is still logged, and the end is not held back."""
    async with _team(open_team) as (team, record, wakeups):
        q = team.queue
        async with QueueFront(team.settings.queue, q, wakeups) as front:
            run = await front.start(record.request, None, run_id="run_unfollowed000001")
            async with worker_on(team, FakeChatModel(root=_turns())):  # type: ignore[arg-type]
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42" and run.result.iterations == TURNS
        assert wakeups.summaries.get(run.run_id, 0) == 0
        row = await q.read(run.run_id)
        assert row is not None and row.done and not row.followed
        assert len(await team.event_attempts(run.run_id)) > 2 * TURNS  # a turn start, an LM call, a cell...


@dataclass
class RowWatchedModel(FakeChatModel):
    """Before the LM call of each turn, waits until what a caller of `rlm_status` sees (`shown`:
    the front's `find`) names that turn."""

    shown: Callable[[], Awaitable[int]] | None = None

    async def complete(
        self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: str, session: str | None = None
    ) -> Completion:
        turn = len(self.root_calls) + 1
        if role == "root" and self.shown is not None:
            while await self.shown() < turn:
                await anyio.sleep(0.01)  # polled, as a caller of rlm_status would (bounded by the rule's deadline)
        return await super().complete(messages, model=model, max_tokens=max_tokens, role=role, session=session)


async def rule_an_unfollowed_run_publishes_at_its_intervals_ticks(open_team: OpenTeam) -> None:
    """Nobody follows it, and its interval is short: its live summaries still come, the first one
    at the interval's tick, announced (the front learns a worker has it); the later ones are
    written to its row without a wake-up, and the front's `find` (`rlm_status`) reads that row:
    the model waits, before each turn's LM call, until `find` names that turn (with no tick's
    publish, or a mirror that answered without the row, the run would never end)."""
    async with open_team(
        queue_poll_s=0.2, live_summary_interval_s=0.0, live_summary_unfollowed_interval_s=0.05
    ) as team:
        record = await _request_with_context(team, "run_unused0000000000")
        wakeups = CountingWakeups(team.queue)
        run_id = "run_unfollowedtick01"
        async with QueueFront(team.settings.queue, team.queue, wakeups) as front:

            async def shown() -> int:
                found = await front.find(run_id, owner=LOCAL_OWNER)
                return (found.snapshot().iterations or 0) if found is not None else TURNS

            lm = RowWatchedModel(root=_turns(), shown=shown)  # type: ignore[arg-type]
            run = await front.start(record.request, None, run_id=run_id)
            async with worker_on(team, lm):
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42" and run.result.iterations == TURNS
        assert wakeups.summaries[run_id] == 1  # its first live summary alone woke the front
        row = await team.queue.read(run_id)
        assert row is not None and not row.followed


async def rule_a_claimed_run_shows_as_running_before_its_first_live_summary(open_team: OpenTeam) -> None:
    """Nobody follows it, and its worker has published no live summary yet (the first one waits
    for the unfollowed interval's tick, days away here): from its claim on, the front that started
    it and another replica's front both say running, in its first phase, turn 0, as a run that has
    just taken its slot in one process does (`ports.queue.shown`); it ends as ever."""
    async with _team(open_team) as (team, record, wakeups):
        run_id = "run_claimedshown0001"
        lm = WatchedModel(root=_turns(), wakeups=wakeups, run_id=run_id, watch_from=TURNS + 1, pause_at=1)  # type: ignore[arg-type]
        other = CountingWakeups(team.queue)
        async with (
            QueueFront(team.settings.queue, team.queue, wakeups) as front,
            QueueFront(team.settings.queue, team.queue, other) as replica,
        ):
            run = await front.start(record.request, None, run_id=run_id)
            assert run.snapshot().status == "queued"
            async with worker_on(team, lm):
                with anyio.fail_after(WAIT_S):
                    await lm.paused.wait()  # claimed, in its first turn's LM call
                row = await team.queue.read(run_id)
                assert row is not None and row.summary.status == "queued"  # no live summary yet
                assert wakeups.summaries.get(run_id, 0) == 0
                for shown in (
                    await front.find(run_id, owner=LOCAL_OWNER),
                    await replica.find(run_id, owner=LOCAL_OWNER),
                ):
                    assert shown is not None
                    snap = shown.snapshot()
                    assert (snap.status, snap.iterations, snap.notice) == ("running", 0, None), snap
                    assert shown.progress.phase is RunPhase.STARTING
                if team.stores.kind == "postgresql":  # the run records are the queue's rows there
                    stored = await team.stores.runs.read_summary(run_id, owner=LOCAL_OWNER)
                    listed = [r for r in await team.stores.runs.list(owner=LOCAL_OWNER) if r.run_id == run_id]
                    assert [(r.status, r.phase, r.iterations) for r in (stored, *listed)] == [
                        ("running", RunPhase.STARTING, 0)
                    ] * 2
                assert wakeups.summaries.get(run_id, 0) == 0
                lm.go.set()
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42" and run.result.iterations == TURNS


async def rule_a_run_followed_before_its_claim_publishes_every_turn(open_team: OpenTeam) -> None:
    """Followed while it was queued (no worker yet): its claim reads the mark, and the front hears
    a live summary naming each turn (the model waits for it before each turn's LM call)."""
    async with _team(open_team) as (team, record, wakeups):
        q = team.queue
        run_id = "run_followedfirst001"
        lm = WatchedModel(root=_turns(), wakeups=wakeups, run_id=run_id)  # type: ignore[arg-type]
        async with QueueFront(team.settings.queue, q, wakeups) as front:
            run = await front.start(record.request, None, run_id=run_id)
            await front.follow_progress(run_id)
            queued = await q.read(run_id)
            assert queued is not None and queued.followed and queued.attempt == 0  # not claimed yet
            async with worker_on(team, lm):
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42" and run.result.iterations == TURNS
        assert wakeups.turns[run_id] == TURNS and wakeups.summaries[run_id] >= TURNS


async def rule_a_run_followed_mid_run_publishes_every_turn_after_the_follow(open_team: OpenTeam) -> None:
    """Unfollowed for its first turns (fewer live summaries than turns), then followed while it
    runs: the worker hears it on the queue's wake-ups, and every later turn is published."""
    async with _team(open_team) as (team, record, wakeups):
        q = team.queue
        run_id = "run_followedlater001"
        pause = 4
        lm = WatchedModel(root=_turns(), wakeups=wakeups, run_id=run_id, watch_from=pause, pause_at=pause)  # type: ignore[arg-type]
        async with QueueFront(team.settings.queue, q, wakeups) as front:
            run = await front.start(record.request, None, run_id=run_id)
            async with worker_on(team, lm):
                with anyio.fail_after(WAIT_S):
                    await lm.paused.wait()
                before = wakeups.summaries.get(run_id, 0)
                assert before < pause  # turns 1-4 began; at most the claim's summary was published
                await front.follow_progress(run_id)
                lm.go.set()
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42" and run.result.iterations == TURNS
        assert wakeups.turns[run_id] == TURNS
        assert wakeups.summaries[run_id] - before >= TURNS - pause + 1  # turns 4, 5 and 6 at least


FOLLOW_RULES: list[Callable[[OpenTeam], Awaitable[None]]] = [
    rule_a_claimed_run_shows_as_running_before_its_first_live_summary,
    rule_an_unfollowed_run_publishes_fewer_live_summaries_than_turns,
    rule_an_unfollowed_run_publishes_at_its_intervals_ticks,
    rule_a_run_followed_before_its_claim_publishes_every_turn,
    rule_a_run_followed_mid_run_publishes_every_turn_after_the_follow,
]

__all__ = ["FOLLOW_RULES"]
