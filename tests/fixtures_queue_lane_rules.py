"""The local lane's rules (part of tests/fixtures_queue_rules.py's `RULES`): a `both` replica's
front offers the runs it starts to its own worker when that worker has room (`LocalLane`), still
through the queue, and follows them in-process; anything else goes the queue's usual way.

The front's queue is wrapped (`Watched`) to see which runs it LISTENed to (`follow_run`) and how
it queued them; the worker shares the front's lane, as the assembly builds a `both` replica."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from rlm_mcp.ports.chat import Completion
from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.service.queue import claims as claims_module
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.local import LocalLane
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeChatModel, repl, submit
from tests.fixtures_queue_team import OpenTeam
from tests.fixtures_queue_worker_rules import _request_with_context, worker_on

WAIT_S = 30


class Watched:
    """The team's queue, noting the runs a front LISTENed to and each enqueue's options."""

    def __init__(self, inner: RunQueuePort) -> None:
        self._inner = inner
        self.listened: list[str] = []
        self.enqueued: dict[str, dict[str, Any]] = {}
        self.woken = 0
        self.follows_said: list[str] = []  # follows said through the queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def follow_run(self, run_id: str) -> None:
        self.listened.append(run_id)
        await self._inner.follow_run(run_id)

    async def enqueue(self, record: Any, need: int, **options: Any) -> None:
        self.enqueued[record.run_id] = options
        await self._inner.enqueue(record, need, **options)

    async def wake_workers(self) -> None:
        self.woken += 1
        await self._inner.wake_workers()

    async def follow_progress(self, run_id: str) -> None:
        self.follows_said.append(run_id)
        await self._inner.follow_progress(run_id)


@dataclass
class HeldModel(FakeChatModel):
    """Holds its first root call (of any run) until `go` is set (`held` says it got there)."""

    held: anyio.Event = field(default_factory=anyio.Event)
    go: anyio.Event = field(default_factory=anyio.Event)

    async def complete(
        self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: str, session: str | None = None
    ) -> Completion:
        if role == "root" and not self.held.is_set():  # the first root call of all (runs share the model)
            self.held.set()
            await self.go.wait()
        return await super().complete(messages, model=model, max_tokens=max_tokens, role=role, session=session)


def _front(team: Any, watched: Watched, lane: LocalLane | None) -> QueueFront:
    return QueueFront(team.settings.queue, watched, Wakeups(watched), lane=lane)


async def rule_a_run_its_fronts_own_worker_has_room_for_runs_there_followed_in_process(open_team: OpenTeam) -> None:
    """Offered to the worker of the front's process: queued for it alone, no other worker told, no
    LISTEN; the mirror says running from the claim on (no live summary yet: the unfollowed interval
    is days) and ends with the worker's final record, handed over in-process."""
    async with open_team(queue_poll_s=0.5, live_summary_unfollowed_interval_s=1e6) as team:
        watched = Watched(team.queue)
        record = await _request_with_context(team, "run_unused0000000000")
        lane = LocalLane(window_s=team.settings.queue.queue_poll_s)
        lm = HeldModel(root=[repl("print(1)"), submit("'42'")])
        notes: list[str] = []
        listening = anyio.Event()
        async with (
            worker_on(team, lm, lane=lane) as worker,
            _front(team, watched, lane) as front,
            anyio.create_task_group() as tg,
        ):
            await wait_until(lambda: lane.room() is not None, within_s=WAIT_S, what="the worker registered")
            # What the workers hear from now on (the worker's registration said "queued" before).
            tg.start_soon(lambda: team.queue.listen_queue(notes.append, on_connect=listening.set, on_disconnect=list))
            with anyio.fail_after(WAIT_S):
                await listening.wait()
            run = await front.start(record.request, None, run_id="run_lane000000000001")
            with anyio.fail_after(WAIT_S):
                await lm.held.wait()
            assert run.snapshot().status == "running"  # told in-process at the claim
            lm.go.set()
            with anyio.fail_after(WAIT_S):
                await run.done.wait()
            # A marker after the run: the queue's notes arrive in order, so every one sent before it is in.
            await team.queue.wake_workers()
            await wait_until(lambda: "queued" in notes, within_s=WAIT_S, what="the marker")
            tg.cancel_scope.cancel()
        assert notes == ["queued"]  # the marker alone: the run's enqueue told no worker
        assert run.result is not None and run.result.answer == "42" and run.result.iterations == 2
        options = watched.enqueued[run.run_id]
        assert options["wake_workers"] is False and options["prefer_worker"] == worker.worker_id
        assert watched.listened == [] and watched.woken == 0
        row = await team.queue.read(run.run_id)
        assert row is not None and row.done and row.worker_id == worker.worker_id and row.attempt == 1


async def rule_a_run_no_local_worker_has_room_for_goes_to_any_worker(open_team: OpenTeam) -> None:
    """The front's lane has no worker with room (none attached here): the run is queued for every
    worker, the front LISTENs to it, and another process's worker runs it."""
    async with open_team(queue_poll_s=0.5) as team:
        watched = Watched(team.queue)
        record = await _request_with_context(team, "run_unused0000000000")
        lane = LocalLane(window_s=team.settings.queue.queue_poll_s)
        async with _front(team, watched, lane) as front:
            run = await front.start(record.request, None, run_id="run_lane000000000002")
            async with worker_on(team, FakeChatModel(root=[submit("'42'")])):
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42"
        assert watched.enqueued[run.run_id]["wake_workers"] is True
        assert watched.enqueued[run.run_id]["prefer_worker"] is None
        assert watched.listened == [run.run_id]


async def rule_an_offer_its_worker_does_not_take_in_time_goes_to_the_others(open_team: OpenTeam) -> None:
    """Offered to a worker of the front's process that does not claim (here: one that never
    looks): when the window ends the other workers are told, the front LISTENs and reads the row,
    and another worker runs it once the preference lapsed."""
    async with open_team(queue_poll_s=0.3) as team:
        q = team.queue
        watched = Watched(q)
        record = await _request_with_context(team, "run_unused0000000000")
        lane = LocalLane(window_s=team.settings.queue.queue_poll_s)
        idle = await q.register_worker("owner-never-claims", 2)
        lane.room = lambda: idle
        async with _front(team, watched, lane) as front:
            run = await front.start(record.request, None, run_id="run_lane000000000003")
            await wait_until(lambda: watched.listened == [run.run_id], within_s=WAIT_S, what="the window's end")
            assert watched.woken == 1
            await team.pass_time(team.settings.queue.queue_poll_s)  # the queue's clock: the preference lapsed
            async with worker_on(team, FakeChatModel(root=[submit("'42'")])) as other:
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42"
        row = await q.read(run.run_id)
        assert row is not None and row.worker_id == other.worker_id != idle


async def rule_a_local_run_handed_back_is_followed_to_its_end_elsewhere(open_team: OpenTeam) -> None:
    """Its worker stops before the run's first LM reply: the run goes back to the queue, not
    ended here, so the front follows it through the queue from then on (LISTEN, the row, the
    progress follow it had said in-process) and sees another worker's final record."""
    async with open_team(queue_poll_s=0.3) as team:
        watched = Watched(team.queue)
        record = await _request_with_context(team, "run_unused0000000000")
        lane = LocalLane(window_s=team.settings.queue.queue_poll_s)
        held = HeldModel(root=[submit("'never'")])
        async with _front(team, watched, lane) as front:
            async with worker_on(team, held, lane=lane) as first:
                await wait_until(lambda: lane.room() is not None, within_s=WAIT_S, what="the worker registered")
                run = await front.start(record.request, None, run_id="run_lane000000000004")
                with anyio.fail_after(WAIT_S):
                    await held.held.wait()
                await front.follow_progress(run.run_id)  # told in-process
                assert watched.follows_said == []
            await wait_until(lambda: watched.listened == [run.run_id], within_s=WAIT_S, what="the fall-back")
            # Said again through the queue: the run's next worker reads the mark at its claim.
            await wait_until(lambda: watched.follows_said == [run.run_id], within_s=WAIT_S, what="the follow")
            assert not run.done.is_set()
            async with worker_on(team, FakeChatModel(root=[submit("'42'")])) as second:
                with anyio.fail_after(WAIT_S):
                    await run.done.wait()
        assert run.result is not None and run.result.answer == "42"
        row = await team.queue.read(run.run_id)
        assert row is not None and row.worker_id == second.worker_id != first.worker_id and row.requeues == 1
        assert row.followed


async def rule_a_run_offered_while_its_worker_waits_to_spread_is_claimed_at_once(open_team: OpenTeam) -> None:
    """Its worker, busy with a run, was woken for a run queued elsewhere and waits before claiming
    so that an idler worker takes that one (here: for days); a run its own front offers it ends
    that wait and is claimed at once."""
    async with open_team(queue_poll_s=0.3, max_runs=2) as team:
        watched = Watched(team.queue)
        record = await _request_with_context(team, "run_unused0000000000")
        lane = LocalLane(window_s=1e6)  # no fall-back: only the worker's own claim can run it
        busy = HeldModel(root=[submit("'first'"), submit("'42'")])
        spread = claims_module.SPREAD_S
        claims_module.SPREAD_S = 1e6
        try:
            async with worker_on(team, busy, lane=lane) as worker, _front(team, watched, lane) as front:
                await wait_until(lambda: lane.room() is not None, within_s=WAIT_S, what="the worker registered")
                first = await front.start(record.request, None, run_id="run_lane000000000005")
                with anyio.fail_after(WAIT_S):
                    await busy.held.wait()
                worker.claims.wake()  # "queued" for someone else's run: it waits to spread
                await wait_until(lambda: worker.claims._spreading is not None, within_s=WAIT_S, what="the wait")
                second = await front.start(record.request, None, run_id="run_lane000000000006")
                with anyio.fail_after(WAIT_S):
                    await second.done.wait()
                busy.go.set()
                with anyio.fail_after(WAIT_S):
                    await first.done.wait()
        finally:
            claims_module.SPREAD_S = spread
        # The model's replies go by call, whichever run makes it: the second run's came first.
        assert [r.result.answer if r.result else None for r in (first, second)] == ["42", "first"]
        assert watched.listened == []


async def rule_a_run_claimed_but_not_started_leaves_its_worker_no_room(open_team: OpenTeam) -> None:
    """One run slot, taken by a run just claimed that has not started yet (its engine is not
    ready): the worker has no room, so the next run is queued for any worker, not offered to it."""
    async with open_team(queue_poll_s=0.3, max_runs=1) as team:
        watched = Watched(team.queue)
        record = await _request_with_context(team, "run_unused0000000000")
        lane = LocalLane(window_s=team.settings.queue.queue_poll_s)
        gate = anyio.Event()
        lm = FakeChatModel(root=[submit("'42'"), submit("'43'")])
        async with worker_on(team, lm, lane=lane, engine_gate=gate), _front(team, watched, lane) as front:
            await wait_until(lambda: lane.room() is not None, within_s=WAIT_S, what="the worker registered")
            first = await front.start(record.request, None, run_id="run_lane000000000007")

            async def claimed() -> bool:
                row = await team.queue.read(first.run_id)
                return row is not None and row.attempt == 1

            await wait_until(claimed, within_s=WAIT_S, what="the first run's claim")
            assert lane.room() is None
            second = await front.start(record.request, None, run_id="run_lane000000000008")
            assert watched.enqueued[second.run_id]["wake_workers"] is True
            gate.set()
            with anyio.fail_after(WAIT_S):
                await first.done.wait()
                await second.done.wait()
        assert {r.result.answer if r.result else None for r in (first, second)} == {"42", "43"}
        assert watched.listened == [second.run_id]


class TurnWakeups(Wakeups):
    """The front's wake-ups, noting the highest turn a run's in-process hand-overs named."""

    def __init__(self, queue: Any) -> None:
        super().__init__(queue)
        self.turns: dict[str, int] = {}
        self.heard = anyio.Event()

    def wake_local(self, run_id: str, record: RunRecord) -> None:
        if not record.done:
            self.turns[run_id] = max(self.turns.get(run_id, 0), record.iterations)
            self.heard.set()
            self.heard = anyio.Event()
        super().wake_local(run_id, record)


@dataclass
class TurnWatchingModel(FakeChatModel):
    """Before each root call from the second on, waits until the front heard a live summary
    naming the turn before it (a run published less often than every turn never ends)."""

    wakeups: TurnWakeups | None = None
    run_id: str = ""

    async def complete(
        self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: str, session: str | None = None
    ) -> Completion:
        turn = len(self.root_calls) + 1
        if role == "root" and self.wakeups is not None and turn > 1:
            while self.wakeups.turns.get(self.run_id, 0) < turn - 1:
                await self.wakeups.heard.wait()
        return await super().complete(messages, model=model, max_tokens=max_tokens, role=role, session=session)


async def rule_a_local_run_followed_turn_by_turn_is_told_in_process(open_team: OpenTeam) -> None:
    """A front follows the progress of a run its own worker executes: the worker is told
    in-process (no statement, no note to every worker) and publishes at the followed interval: the
    front hears a live summary naming each turn (the unfollowed interval is days here)."""
    async with open_team(queue_poll_s=0.3, live_summary_interval_s=0.0, live_summary_unfollowed_interval_s=1e6) as team:
        watched = Watched(team.queue)
        record = await _request_with_context(team, "run_unused0000000000")
        lane = LocalLane(window_s=team.settings.queue.queue_poll_s)
        wakeups = TurnWakeups(watched)
        run_id = "run_lane000000000009"
        lm = TurnWatchingModel(root=[*(repl(f"print({i})") for i in range(3)), submit("'42'")])
        lm.wakeups, lm.run_id = wakeups, run_id
        async with (
            worker_on(team, lm, lane=lane),
            QueueFront(team.settings.queue, watched, wakeups, lane=lane) as front,
        ):
            await wait_until(lambda: lane.room() is not None, within_s=WAIT_S, what="the worker registered")
            run = await front.start(record.request, None, run_id=run_id)
            await front.follow_progress(run_id)
            with anyio.fail_after(WAIT_S):
                await run.done.wait()
        assert run.result is not None and run.result.answer == "42" and run.result.iterations == 4
        assert wakeups.turns[run_id] >= 3
        assert watched.follows_said == [] and watched.listened == []


LANE_RULES: list[Callable[[OpenTeam], Awaitable[None]]] = [
    rule_a_local_run_followed_turn_by_turn_is_told_in_process,
    rule_a_run_claimed_but_not_started_leaves_its_worker_no_room,
    rule_a_run_offered_while_its_worker_waits_to_spread_is_claimed_at_once,
    rule_a_run_its_fronts_own_worker_has_room_for_runs_there_followed_in_process,
    rule_a_run_no_local_worker_has_room_for_goes_to_any_worker,
    rule_an_offer_its_worker_does_not_take_in_time_goes_to_the_others,
    rule_a_local_run_handed_back_is_followed_to_its_end_elsewhere,
]

__all__ = ["LANE_RULES"]
