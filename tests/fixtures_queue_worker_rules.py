"""The queue's worker rules (part of tests/fixtures_queue_rules.py's `RULES`): a `QueueWorker`
over either queue, executing runs with the in-process sandboxes and scripted model of
tests/fixtures_engine.py (no Docker), fenced by its claim's attempt."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio

from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.queue import Beat, RunQueuePort, RunRow, RunState
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.queue.local import LocalLane
from rlm_mcp.service.queue.wakeups import Wakeups
from rlm_mcp.service.queue.worker import QueueWorker
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, repl, submit
from tests.fixtures_queue_team import OpenTeam, Team, summary


@asynccontextmanager
async def worker_on(
    team: Team,
    lm: FakeChatModel,
    queue: RunQueuePort | None = None,
    *,
    lane: LocalLane | None = None,
    engine_gate: anyio.Event | None = None,
) -> AsyncIterator[QueueWorker]:
    """A `QueueWorker` over the team's queue (or `queue`, one wrapping it), executing runs here
    with `lm` and in-process sandboxes (tests/fixtures_engine.py): no Docker. `lane`: its link to
    a front of the same process (a `both` replica's). `engine_gate`: a claimed run waits for it
    before it starts (its engine is handed over once it is set)."""
    settings = team.settings
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory(), system_prompt="SYSTEM")

    async def engine_of() -> RLMEngine:
        if engine_gate is not None:
            await engine_gate.wait()
        return engine

    sandboxes = SandboxManager(settings.sandbox)
    runs = RunManager(settings.runs, team.stores.contexts, team.stores.runs, owners=configured_owners(settings.server))
    worker = QueueWorker(settings.queue, queue or team.queue, team.logs, runs, sandboxes, engine_of, lane=lane)
    async with runs, worker:
        yield worker


async def _request_with_context(team: Team, run_id: str) -> RunRecord:
    info = await team.stores.contexts.put_bytes(
        b"The magic number is 42. " * 10, name="ctx", format="text", source={}, owner=LOCAL_OWNER
    )
    return summary(run_id, context_ids=[info.context_id])


async def rule_a_worker_executes_a_queued_run_and_the_front_sees_it_end(open_team: OpenTeam) -> None:
    async with open_team(queue_poll_s=0.2) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")])
        async with QueueFront(team.settings.queue, q, Wakeups(q)) as front:
            run = await front.start(record.request, None, run_id="run_worker0000000001")
            async with worker_on(team, lm) as worker:
                with anyio.fail_after(30):
                    await run.done.wait()
        assert run.result is not None and run.result.status == "completed" and run.result.answer == "42"
        row = await q.read(run.run_id)
        assert row is not None and row.done and row.attempt == 1 and row.lm_called and row.requeues == 0
        assert row.summary.result is not None and row.summary.result.answer == "42"
        assert worker.worker_id is not None and row.worker_id == worker.worker_id


async def _waiting_on_the_model(q: RunQueuePort, run_id: str, lm: FakeChatModel) -> None:
    """Wait (polling under a deadline) until a worker runs the run and waits on its model."""
    with anyio.fail_after(30):
        while not lm.root_calls:
            await anyio.sleep(0.05)
    row = await q.read(run_id)
    assert row is not None and row.state is RunState.RUNNING


async def rule_a_stopping_worker_hands_a_run_with_no_lm_reply_back_once(open_team: OpenTeam) -> None:
    async with open_team(queue_poll_s=0.2) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")], root_delay_s=3600.0)  # the model never answers in time
        await q.enqueue(record.model_copy(update={"run_id": "run_handback00000001"}), 1)
        async with worker_on(team, lm):
            await _waiting_on_the_model(q, "run_handback00000001", lm)
        row = await q.read("run_handback00000001")
        assert row is not None and row.state is RunState.QUEUED and row.requeues == 1 and row.worker_id is None
        assert not row.lm_called and "queued again" in row.summary.to_stored()["notice"]


async def rule_a_run_shown_in_its_first_turn_before_its_model_answers_has_no_lm_reply_recorded(
    open_team: OpenTeam,
) -> None:
    """A turn counts from its start, before its LM call: the published summary says `running`,
    turn 1, while the model has not answered, and the `lm_called` mark (the requeue rule's one
    input) is not set, so a worker lost then has its run queued again. Whoever kills a worker to
    see its run end as lost waits for the mark, not the turn (bench/team_probes.py)."""
    async with open_team(queue_poll_s=0.2) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")], root_delay_s=3600.0)  # the model never answers in time
        await q.enqueue(record.model_copy(update={"run_id": "run_turnone00000001"}), 1)

        async def shown_in_turn_one() -> bool:  # what bench/team_probes.py's death probe first waited for
            row = await q.read("run_turnone00000001")
            return row is not None and row.summary.status == "running" and row.summary.iterations >= 1

        async with worker_on(team, lm):
            await wait_until(shown_in_turn_one, within_s=30, what="the run's summary to show turn 1")
            row = await q.read("run_turnone00000001")
            assert row is not None and row.state is RunState.RUNNING and lm.root_calls and not row.lm_called
        row = await q.read("run_turnone00000001")  # the worker stopped: handed back, as a lost one is swept
        assert row is not None and row.state is RunState.QUEUED and row.requeues == 1 and not row.lm_called


async def rule_a_worker_stops_a_run_that_is_no_longer_its_own_and_writes_nothing(open_team: OpenTeam) -> None:
    """Fencing in the worker: the run is ended behind its back (as a sweeper ends the run of a
    worker it judged lost); the next heartbeat stops it, and nothing more is written for it."""
    async with open_team(queue_poll_s=0.2, worker_lease_s=1.5) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")], root_delay_s=3600.0)
        await q.enqueue(record.model_copy(update={"run_id": "run_takenaway000001"}), 1)
        async with worker_on(team, lm) as worker:
            await _waiting_on_the_model(q, "run_takenaway000001", lm)
            row = await q.read("run_takenaway000001")
            assert row is not None
            assert await q.finish(row.run_id, row.summary.ended("error", "ended elsewhere"), attempt=row.attempt)
            with anyio.fail_after(30):
                while worker._running:  # the heartbeat's verdict stops it
                    await anyio.sleep(0.05)
        row = await q.read("run_takenaway000001")
        assert row is not None and row.done and row.attempt == 1
        assert row.summary.result is not None and row.summary.result.reason == "ended elsewhere"  # nothing over it


class _DeafToCancels:
    """The team's queue, seen by a worker that never hears a cancel's note (as across a listener's
    reconnect) and whose `cancels` reads are counted."""

    def __init__(self, queue: RunQueuePort) -> None:
        self._queue = queue
        self.cancel_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    async def listen_queue(
        self, on_note: Callable[[str], None], *, on_connect: Callable[[], object], on_disconnect: Callable[[], object]
    ) -> None:
        def heard(payload: str) -> None:
            if not payload.startswith("cancel "):
                on_note(payload)

        await self._queue.listen_queue(heard, on_connect=on_connect, on_disconnect=on_disconnect)

    async def cancels(self, worker_id: int) -> list[str]:
        self.cancel_reads += 1
        return await self._queue.cancels(worker_id)


async def rule_a_cancel_whose_note_was_lost_reaches_the_worker_by_its_heartbeat(open_team: OpenTeam) -> None:
    """A worker that beats at least every poll interval (lease/3 <= RLM_MCP_QUEUE_POLL_S) reads
    the cancels asked of its runs from its heartbeat alone: a cancel whose note it never heard
    still ends its run, with no read of the cancels of its own. Beats every 2 s: the worker reads
    the cancels itself only when its last beat is two beats old, so a loaded machine may delay a
    beat by up to 2 s before this rule's count could change."""
    async with open_team(queue_poll_s=2.0, worker_lease_s=6.0) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")], root_delay_s=3600.0)
        await q.enqueue(record.model_copy(update={"run_id": "run_deafcancel00001"}), 1)
        deaf = _DeafToCancels(q)
        async with worker_on(team, lm, cast(RunQueuePort, deaf)) as worker:
            await _waiting_on_the_model(q, "run_deafcancel00001", lm)
            assert not await q.cancel("run_deafcancel00001", record)  # running: its worker ends it
            with anyio.fail_after(30):
                while worker._running:
                    await anyio.sleep(0.05)
        row = await q.read("run_deafcancel00001")
        assert row is not None and row.done and row.summary.result is not None
        assert row.summary.result.status == "cancelled", row.summary.result
        assert deaf.cancel_reads == 0


class _Claims:
    """The team's queue, each `claim_many`'s answer kept (the run ids of each claim, in order)."""

    def __init__(self, queue: RunQueuePort) -> None:
        self._queue = queue
        self.batches: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    async def claim_many(
        self, worker_id: int, free: int, cap: int, *, limit: int, sessions: bool = True
    ) -> list[RunRow]:
        rows = await self._queue.claim_many(worker_id, free, cap, limit=limit, sessions=sessions)
        if rows:
            self.batches.append([r.run_id for r in rows])
        return rows


async def rule_a_worker_claims_the_runs_waiting_for_it_in_one_claim(open_team: OpenTeam) -> None:
    """Runs queued before a worker starts are claimed in its first claim, as many as it has free
    run slots; each runs to its end under its own attempt."""
    async with open_team(queue_poll_s=0.2, max_runs=4) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        names = [f"run_batched{i:09d}" for i in range(3)]
        for name in names:
            await q.enqueue(record.model_copy(update={"run_id": name}), 1)
        claims = _Claims(q)
        async with worker_on(
            team, FakeChatModel(root=lambda _m, _t: submit("'42'")), cast(RunQueuePort, claims)
        ) as worker:
            for name in names:
                await _ran_here(q, name, worker)
        assert claims.batches == [names]


class _HeldBeat:
    """The team's queue, its first heartbeat held after its rows are read until `release` is set:
    a beat whose answer predates a claim arrives after the claimed run started."""

    def __init__(self, queue: RunQueuePort) -> None:
        self._queue = queue
        self.read, self.release = anyio.Event(), anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    async def heartbeat(self, worker_id: int) -> Beat:
        beat = await self._queue.heartbeat(worker_id)
        if not self.read.is_set():
            self.read.set()
            await self.release.wait()
        return beat


async def rule_a_beat_older_than_a_claim_does_not_stop_the_run_claimed(open_team: OpenTeam) -> None:
    """A heartbeat's rows read before a claim committed do not name the run claimed: the worker
    judges that run by a later beat, and the run runs to its end."""
    async with open_team(queue_poll_s=0.2, worker_lease_s=30.0) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")], root_delay_s=0.5)
        held = _HeldBeat(q)
        async with worker_on(team, lm, cast(RunQueuePort, held)) as worker:
            with anyio.fail_after(60):
                await held.read.wait()  # the first beat's rows: no run yet
            await q.enqueue(record.model_copy(update={"run_id": "run_beatraced000001"}), 1)
            with anyio.fail_after(30):
                while "run_beatraced000001" not in worker._running:
                    await anyio.sleep(0.05)
            held.release.set()  # the stale beat's verdict, with the run now running here
            with anyio.fail_after(30):
                while not ((row := await q.read("run_beatraced000001")) and row.done):
                    await anyio.sleep(0.05)
        assert row.summary.result is not None and row.summary.result.answer == "42", row.summary.result


class _CuttableListener:
    """The team's queue, seen by one worker whose queue listener the test cuts (`cut`): its
    connection ends (`on_disconnect`) and never comes back, so nothing queued after is heard.
    `idle` is set once the listener is connected and a look after that found nothing: a claim
    (`claimed_nothing`) or a timed look (`found_none_queued`)."""

    def __init__(self, queue: RunQueuePort) -> None:
        self._queue = queue
        self._scope = anyio.CancelScope()
        self.connected, self.disconnected = anyio.Event(), anyio.Event()
        self.claimed_nothing, self.found_none_queued = anyio.Event(), anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    async def listen_queue(
        self, on_note: Callable[[str], None], *, on_connect: Callable[[], object], on_disconnect: Callable[[], object]
    ) -> None:
        def connected() -> None:
            on_connect()
            self.connected.set()

        def disconnected() -> None:
            on_disconnect()
            self.disconnected.set()

        with self._scope:
            await self._queue.listen_queue(on_note, on_connect=connected, on_disconnect=disconnected)
        await anyio.sleep_forever()  # cut: never listening again

    async def claim_many(
        self, worker_id: int, free: int, cap: int, *, limit: int, sessions: bool = True
    ) -> list[RunRow]:
        connected = self.connected.is_set()
        rows = await self._queue.claim_many(worker_id, free, cap, limit=limit, sessions=sessions)
        if not rows and connected:
            self.claimed_nothing.set()
        return rows

    async def any_queued(self) -> bool:
        connected = self.connected.is_set()
        found = await self._queue.any_queued()
        if not found and connected:
            self.found_none_queued.set()
        return found

    async def cut(self) -> None:
        self._scope.cancel()
        with anyio.fail_after(30):
            await self.disconnected.wait()


async def _ran_here(q: RunQueuePort, run_id: str, worker: QueueWorker) -> None:
    """The run was claimed, and run to its end, by `worker`."""
    with anyio.fail_after(30):  # a bound, not a timing: the worker's next timed look is an hour away
        while not ((row := await q.read(run_id)) and row.done):
            await anyio.sleep(0.05)
    assert row.attempt == 1 and row.worker_id == worker.worker_id
    assert row.summary.result is not None and row.summary.result.answer == "42", row.summary.result


async def rule_a_run_queued_while_a_worker_idles_is_claimed_on_its_note(open_team: OpenTeam) -> None:
    """An idle worker looks again after an hour here: the run queued meanwhile reaches it by the
    queue's note ("queued"), in the statement that queued it."""
    async with open_team(queue_poll_s=3600.0, queue_idle_poll_s=3600.0) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")])
        listener = _CuttableListener(q)
        async with worker_on(team, lm, cast(RunQueuePort, listener)) as worker:
            with anyio.fail_after(30):
                await listener.claimed_nothing.wait()  # idle, listening
            await q.enqueue(record.model_copy(update={"run_id": "run_noted0000000001"}), 1)
            await _ran_here(q, "run_noted0000000001", worker)


async def rule_a_worker_whose_listener_is_down_polls_and_still_claims(open_team: OpenTeam) -> None:
    """With nothing queued and its listener connected, an idle worker looks every
    RLM_MCP_QUEUE_IDLE_POLL_S (an hour here); its listener lost, it looks every poll interval
    again at once, and claims a run whose note nobody heard."""
    async with open_team(queue_poll_s=0.2, queue_idle_poll_s=3600.0) as team:
        q = team.queue
        record = await _request_with_context(team, "run_unused0000000000")
        lm = FakeChatModel(root=[submit("'42'")])
        listener = _CuttableListener(q)
        async with worker_on(team, lm, cast(RunQueuePort, listener)) as worker:
            with anyio.fail_after(30):
                await listener.found_none_queued.wait()
            assert worker.claims.idle_wait_s() == 3600.0  # nothing queued, every new run is heard
            await listener.cut()
            assert worker.claims.idle_wait_s() == 0.2
            await q.enqueue(record.model_copy(update={"run_id": "run_unheard00000001"}), 1)
            await _ran_here(q, "run_unheard00000001", worker)


async def rule_coalesced_live_summaries_lose_no_event_and_never_hold_back_the_end(open_team: OpenTeam) -> None:
    """Live summaries coalesced (one a minute here: every one after the first waits) write the
    same events as one per progress event, and the final record is written when the run ends,
    not when the interval would allow the next live summary."""
    logged: list[int] = []
    for interval in (0.0, 60.0):
        async with open_team(queue_poll_s=0.2, live_summary_interval_s=interval) as team:
            q = team.queue
            record = await _request_with_context(team, "run_unused0000000000")
            lm = FakeChatModel(root=[repl("print(1)"), repl("print(2)"), repl("print(3)"), submit("'42'")])
            async with QueueFront(team.settings.queue, q, Wakeups(q)) as front:
                run = await front.start(record.request, None, run_id="run_coalesced000001")
                async with worker_on(team, lm):
                    with anyio.fail_after(30):
                        await run.done.wait()
            assert run.result is not None and run.result.status == "completed" and run.result.answer == "42"
            row = await q.read(run.run_id)
            assert row is not None and row.done and row.lm_called and row.summary.result is not None
            assert row.summary.result.answer == "42" and row.summary.result.iterations == 4
            logged.append(len(await team.event_attempts(run.run_id)))
    assert logged[0] == logged[1] > 8  # four turns: at least a turn start, an LM call and a cell each


WORKER_RULES: list[Callable[[OpenTeam], Awaitable[None]]] = [
    rule_a_worker_executes_a_queued_run_and_the_front_sees_it_end,
    rule_a_stopping_worker_hands_a_run_with_no_lm_reply_back_once,
    rule_a_run_shown_in_its_first_turn_before_its_model_answers_has_no_lm_reply_recorded,
    rule_a_worker_stops_a_run_that_is_no_longer_its_own_and_writes_nothing,
    rule_a_cancel_whose_note_was_lost_reaches_the_worker_by_its_heartbeat,
    rule_a_beat_older_than_a_claim_does_not_stop_the_run_claimed,
    rule_a_worker_claims_the_runs_waiting_for_it_in_one_claim,
    rule_coalesced_live_summaries_lose_no_event_and_never_hold_back_the_end,
    rule_a_run_queued_while_a_worker_idles_is_claimed_on_its_note,
    rule_a_worker_whose_listener_is_down_polls_and_still_claims,
]

__all__ = ["WORKER_RULES"]
